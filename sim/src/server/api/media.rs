//! Images in chat messages, as vLLM serves a vision model: `image_url` content parts given as
//! base64 `data:` URLs or fetched over http(s) (bounded in size and time), their width and
//! height read from the PNG / JPEG / GIF header, their prompt tokens by Qwen2-VL's rule, and
//! vLLM 0.33's multi-modal processor cache (`vllm:mm_cache_queries` / `_hits`).
//!
//! The token rule is Qwen2-VL's (`Qwen/Qwen2-VL-7B-Instruct`, `preprocessor_config.json`:
//! `patch_size` 14, `merge_size` 2, `min_pixels` 3136, `max_pixels` 12845056; transformers'
//! `smart_resize`, which vLLM's `Qwen2VLProcessingInfo` calls): the image is resized to
//! `h' × w'`, multiples of 28 (rounded half to even, as Python's `round`; scaled down or up
//! to stay within the pixel bounds), and costs `(h'/28)·(w'/28)` `<|image_pad|>` tokens plus
//! the `<|vision_start|>` and `<|vision_end|>` the chat template puts around them.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use base64::Engine as _;
use parking_lot::Mutex;

/// Pixels of one merged patch side: `patch_size` × `merge_size`.
pub const FACTOR: u64 = 28;
/// Qwen2-VL's `min_pixels`.
pub const MIN_PIXELS: u64 = 3136;
/// Qwen2-VL's `max_pixels`.
pub const MAX_PIXELS: u64 = 12_845_056;
/// Tokens the chat template adds around each image (`<|vision_start|>`, `<|vision_end|>`).
pub const IMAGE_WRAP_TOKENS: u32 = 2;
/// Most images in one prompt (vLLM's `--limit-mm-per-prompt`, here fixed).
pub const MAX_IMAGES_PER_PROMPT: usize = 16;
/// Largest image file accepted (decoded base64 or fetched body).
pub const MAX_IMAGE_BYTES: usize = 20 * 1024 * 1024;
/// Deadline of an image fetch (vLLM's `VLLM_IMAGE_FETCH_TIMEOUT` default).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Capacity of the processor cache in bytes (vLLM's `--mm-processor-cache-gb` default, 4 GiB).
pub const CACHE_BYTES: u64 = 4 << 30;

/// Bytes of one image's processed inputs in the cache: Qwen2-VL's float32 `pixel_values`,
/// `(h'/14)·(w'/14)` patches of 3 × 2 × 14 × 14 values.
fn cached_bytes(h: u64, w: u64) -> u64 {
    (h / 14) * (w / 14) * 1176 * 4
}

/// Image file formats whose header the simulator reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// PNG.
    Png,
    /// JPEG (baseline or progressive).
    Jpeg,
    /// GIF.
    Gif,
}

/// What the simulator needs of one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// The file format.
    pub format: Format,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// FNV-1a of the file's bytes (the processor cache key and part of the prompt key).
    pub hash: u64,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]]))
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Reads a PNG: the signature, every chunk's length and CRC up to `IEND`, the size from
/// `IHDR` (first) and at least one `IDAT`. A truncated or corrupted file is an error.
fn png(b: &[u8]) -> Result<(u32, u32), String> {
    let mut at = PNG_SIGNATURE.len();
    let mut size = None;
    let mut idat = false;
    loop {
        let len = be32(b, at).ok_or("truncated PNG (no IEND chunk)")? as usize;
        let kind = b.get(at + 4..at + 8).ok_or("truncated PNG chunk header")?;
        let data_end = (at + 8).checked_add(len).ok_or("PNG chunk too long")?;
        let crc =
            be32(b, data_end).ok_or_else(|| format!("truncated PNG chunk {:?}", String::from_utf8_lossy(kind)))?;
        if crc32fast::hash(&b[at + 4..data_end]) != crc {
            return Err(format!("PNG chunk {:?} has a bad CRC", String::from_utf8_lossy(kind)));
        }
        match (kind, size) {
            (b"IHDR", None) if len == 13 => {
                let (w, h) = (be32(b, at + 8).unwrap_or(0), be32(b, at + 12).unwrap_or(0));
                if w == 0 || h == 0 || w > i32::MAX as u32 || h > i32::MAX as u32 {
                    return Err(format!("PNG size {w}x{h} is invalid"));
                }
                size = Some((w, h));
            }
            (b"IHDR", _) => return Err("bad PNG IHDR chunk".into()),
            (_, None) => return Err("PNG does not start with IHDR".into()),
            (b"IDAT", _) => idat = true,
            (b"IEND", Some(s)) if idat => return Ok(s),
            (b"IEND", _) => return Err("PNG has no image data (IDAT)".into()),
            _ => {}
        }
        at = data_end + 4;
    }
}

/// Reads a JPEG's size from its first start-of-frame marker.
fn jpeg(b: &[u8]) -> Result<(u32, u32), String> {
    let mut at = 2;
    loop {
        // Markers may be padded with 0xFF fill bytes.
        while b.get(at) == Some(&0xFF) && b.get(at + 1) == Some(&0xFF) {
            at += 1;
        }
        if b.get(at) != Some(&0xFF) {
            return Err("corrupt JPEG: expected a marker".into());
        }
        let marker = *b.get(at + 1).ok_or("truncated JPEG")?;
        match marker {
            0xD8 | 0x01 | 0xD0..=0xD7 => at += 2,
            0xD9 | 0xDA => return Err("JPEG has no frame header (SOF) before its scan".into()),
            _ => {
                let len = usize::from(be16(b, at + 2).ok_or("truncated JPEG segment")?);
                if len < 2 {
                    return Err("corrupt JPEG segment length".into());
                }
                let sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
                if sof {
                    let h = be16(b, at + 5).ok_or("truncated JPEG frame header")?;
                    let w = be16(b, at + 7).ok_or("truncated JPEG frame header")?;
                    if w == 0 || h == 0 {
                        return Err(format!("JPEG size {w}x{h} is invalid"));
                    }
                    if b.len() < at + 2 + len {
                        return Err("truncated JPEG frame header".into());
                    }
                    return Ok((u32::from(w), u32::from(h)));
                }
                at += 2 + len;
            }
        }
    }
}

/// Identifies an image file and reads its size, as `PIL.Image.open` would refuse what it
/// cannot read.
pub fn inspect(bytes: &[u8]) -> Result<ImageInfo, String> {
    let (format, (width, height)) = if bytes.starts_with(PNG_SIGNATURE) {
        (Format::Png, png(bytes)?)
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        (Format::Jpeg, jpeg(bytes)?)
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        let w = bytes.get(6..8).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or("truncated GIF")?;
        let h = bytes.get(8..10).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or("truncated GIF")?;
        if w == 0 || h == 0 {
            return Err(format!("GIF size {w}x{h} is invalid"));
        }
        (Format::Gif, (u32::from(w), u32::from(h)))
    } else {
        return Err(format!(
            "cannot identify image file ({} bytes; the simulator reads PNG, JPEG and GIF)",
            bytes.len()
        ));
    };
    Ok(ImageInfo { format, width, height, hash: fnv1a(bytes) })
}

/// Python's `round(n / d)` for non-negative integers (half to even).
fn round_div(n: u64, d: u64) -> u64 {
    let (q, r) = (n / d, n % d);
    match (2 * r).cmp(&d) {
        std::cmp::Ordering::Greater => q + 1,
        std::cmp::Ordering::Equal => q + (q & 1),
        std::cmp::Ordering::Less => q,
    }
}

/// Qwen2-VL's `smart_resize`: the size (height, width) the processor resizes an image to.
pub fn smart_resize(height: u32, width: u32) -> Result<(u64, u64), String> {
    let (h, w) = (u64::from(height), u64::from(width));
    if h == 0 || w == 0 {
        return Err(format!("image size {width}x{height} is invalid"));
    }
    let (hi, lo) = (h.max(w), h.min(w));
    if hi > 200 * lo {
        return Err(format!("absolute aspect ratio must be smaller than 200, got {}", hi as f64 / lo as f64));
    }
    let mut hb = round_div(h, FACTOR) * FACTOR;
    let mut wb = round_div(w, FACTOR) * FACTOR;
    let (hf, wf, f) = (h as f64, w as f64, FACTOR as f64);
    if hb * wb > MAX_PIXELS {
        let beta = (hf * wf / MAX_PIXELS as f64).sqrt();
        hb = FACTOR.max((hf / beta / f).floor() as u64 * FACTOR);
        wb = FACTOR.max((wf / beta / f).floor() as u64 * FACTOR);
    } else if hb * wb < MIN_PIXELS {
        let beta = (MIN_PIXELS as f64 / (hf * wf)).sqrt();
        hb = (hf * beta / f).ceil() as u64 * FACTOR;
        wb = (wf * beta / f).ceil() as u64 * FACTOR;
    }
    Ok((hb, wb))
}

/// Prompt tokens of one image of `width` × `height` pixels: `(h'/28)·(w'/28) + 2`.
pub fn image_tokens(width: u32, height: u32) -> Result<u32, String> {
    let (h, w) = smart_resize(height, width)?;
    let n = (h / FACTOR) * (w / FACTOR) + u64::from(IMAGE_WRAP_TOKENS);
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Decodes a `data:` URL (`data:image/png;base64,...`).
fn data_url(url: &str) -> Result<Vec<u8>, String> {
    let rest = &url[5..];
    let (meta, payload) = rest.split_once(',').ok_or("a data URL needs a ',' before its data")?;
    let (media, base64) = match meta.strip_suffix(";base64") {
        Some(m) => (m, true),
        None => (meta, false),
    };
    if !base64 {
        return Err("only base64 data URLs are supported (data:image/...;base64,...)".into());
    }
    if !media.is_empty() && !media.starts_with("image/") {
        return Err(format!("the data URL's media type {media:?} is not an image type"));
    }
    if payload.len() / 4 * 3 > MAX_IMAGE_BYTES {
        return Err(format!("the image is larger than {MAX_IMAGE_BYTES} bytes"));
    }
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    engine.decode(payload.trim()).map_err(|e| format!("invalid base64 image data: {e}"))
}

/// The processor cache: LRU over image hashes, bounded by the bytes of their processed inputs.
#[derive(Debug, Default)]
struct MmCache {
    used: u64,
    tick: u64,
    entries: HashMap<u64, (u64, u64)>,
    order: VecDeque<(u64, u64)>,
}

impl MmCache {
    /// Looks `hash` up (a hit refreshes it), inserting it on a miss; returns whether it hit.
    fn query(&mut self, hash: u64, bytes: u64) -> bool {
        self.tick += 1;
        let tick = self.tick;
        let hit = match self.entries.get_mut(&hash) {
            Some(e) => {
                e.1 = tick;
                true
            }
            None if bytes > CACHE_BYTES => return false,
            None => {
                self.entries.insert(hash, (bytes, tick));
                self.used += bytes;
                false
            }
        };
        self.order.push_back((hash, tick));
        while self.used > CACHE_BYTES {
            let Some((h, t)) = self.order.pop_front() else { break };
            if self.entries.get(&h).is_some_and(|e| e.1 == t)
                && let Some((b, _)) = self.entries.remove(&h)
            {
                self.used -= b;
            }
        }
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order.retain(|(h, t)| entries.get(h).is_some_and(|e| e.1 == *t));
        }
        hit
    }
}

/// Most image URLs fetched at once, over all requests: with [`MAX_IMAGE_BYTES`] each, at most
/// 8 × 20 MiB of fetched bodies are held at a time (a fetched image is dropped once its header
/// is read).
pub const MAX_CONCURRENT_FETCHES: usize = 8;

/// Loading images and the processor cache, shared by the handlers.
#[derive(Debug)]
pub struct MediaState {
    http: Mutex<Option<reqwest::Client>>,
    cache: Mutex<MmCache>,
    fetches: tokio::sync::Semaphore,
}

impl Default for MediaState {
    fn default() -> Self {
        Self {
            http: Mutex::default(),
            cache: Mutex::default(),
            fetches: tokio::sync::Semaphore::new(MAX_CONCURRENT_FETCHES),
        }
    }
}

/// One loaded image of a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadedImage {
    /// What its header says.
    pub info: ImageInfo,
    /// Its prompt tokens.
    pub tokens: u32,
}

impl MediaState {
    /// An empty cache; the HTTP client is built on the first fetch.
    pub fn new() -> Self {
        Self::default()
    }

    fn client(&self) -> Result<reqwest::Client, String> {
        let mut c = self.http.lock();
        if let Some(c) = &*c {
            return Ok(c.clone());
        }
        // An error only means a provider is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let built = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build the HTTP client for image URLs: {e}"))?;
        *c = Some(built.clone());
        Ok(built)
    }

    async fn fetch(&self, url: &str) -> Result<Vec<u8>, String> {
        let client = self.client()?;
        let get = async {
            let _permit = self.fetches.acquire().await.map_err(|e| format!("cannot fetch the image: {e}"))?;
            let mut r = client.get(url).send().await.map_err(|e| format!("cannot fetch the image: {e}"))?;
            if !r.status().is_success() {
                return Err(format!("fetching the image returned HTTP {}", r.status()));
            }
            if r.content_length().is_some_and(|n| n > MAX_IMAGE_BYTES as u64) {
                return Err(format!("the image is larger than {MAX_IMAGE_BYTES} bytes"));
            }
            let mut body = Vec::new();
            while let Some(chunk) = r.chunk().await.map_err(|e| format!("cannot fetch the image: {e}"))? {
                if body.len() + chunk.len() > MAX_IMAGE_BYTES {
                    return Err(format!("the image is larger than {MAX_IMAGE_BYTES} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(body)
        };
        match tokio::time::timeout(FETCH_TIMEOUT, get).await {
            Ok(r) => r,
            Err(_) => Err(format!("fetching the image took longer than {} s", FETCH_TIMEOUT.as_secs())),
        }
    }

    /// Loads one image URL (`data:` or `http(s)://`) and reads its header and tokens.
    pub async fn load(&self, url: &str) -> Result<LoadedImage, String> {
        let url = url.trim();
        let bytes = if url.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("data:")) {
            data_url(url)?
        } else if url.starts_with("http://") || url.starts_with("https://") {
            self.fetch(url).await?
        } else {
            let shown: String = url.chars().take(64).collect();
            return Err(format!("the image URL {shown:?} is neither a data: URL nor http(s)"));
        };
        let info = inspect(&bytes)?;
        let tokens = image_tokens(info.width, info.height)?;
        Ok(LoadedImage { info, tokens })
    }

    /// Passes a prompt's images through the processor cache; returns (queries, hits).
    pub fn process(&self, images: &[LoadedImage]) -> (u64, u64) {
        let mut c = self.cache.lock();
        let mut hits = 0;
        for i in images {
            let (h, w) = smart_resize(i.info.height, i.info.width).unwrap_or((0, 0));
            if c.query(i.info.hash, cached_bytes(h, w)) {
                hits += 1;
            }
        }
        (images.len() as u64, hits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        let mut v = (data.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(kind);
        v.extend_from_slice(data);
        let mut c = kind.to_vec();
        c.extend_from_slice(data);
        v.extend_from_slice(&crc32fast::hash(&c).to_be_bytes());
        v
    }

    fn tiny_png(w: u32, h: u32) -> Vec<u8> {
        let mut ihdr = w.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&h.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let mut f = PNG_SIGNATURE.to_vec();
        f.extend(chunk(b"IHDR", &ihdr));
        f.extend(chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]));
        f.extend(chunk(b"IEND", &[]));
        f
    }

    #[test]
    fn png_header_and_integrity() {
        let f = tiny_png(448, 336);
        let i = inspect(&f).unwrap();
        assert_eq!((i.format, i.width, i.height), (Format::Png, 448, 336));
        // truncated: no IEND
        assert!(inspect(&f[..f.len() - 6]).unwrap_err().contains("truncated"));
        // a flipped byte in IHDR breaks its CRC
        let mut bad = f.clone();
        bad[18] ^= 1;
        assert!(inspect(&bad).unwrap_err().contains("CRC"));
        assert!(inspect(b"hello world").unwrap_err().contains("cannot identify"));
        let zero = tiny_png(0, 10);
        assert!(inspect(&zero).is_err());
    }

    #[test]
    fn jpeg_and_gif_headers() {
        // SOI, APP0 (len 16), SOF0 (len 17: precision 8, h=480, w=640, 3 components)
        let mut j = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
        j.extend_from_slice(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
        j.extend_from_slice(&[0xFF, 0xC0, 0x00, 0x11, 0x08, 0x01, 0xE0, 0x02, 0x80, 0x03]);
        j.extend_from_slice(&[1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        j.extend_from_slice(&[0xFF, 0xD9]);
        let i = inspect(&j).unwrap();
        assert_eq!((i.format, i.width, i.height), (Format::Jpeg, 640, 480));
        assert!(inspect(&j[..12]).is_err());
        let g = b"GIF89a\x40\x01\xf0\x00rest";
        let i = inspect(g).unwrap();
        assert_eq!((i.format, i.width, i.height), (Format::Gif, 320, 240));
    }

    #[test]
    fn qwen2_vl_token_rule() {
        // multiples of 28: (h/28)(w/28) + 2
        assert_eq!(image_tokens(448, 448).unwrap(), 16 * 16 + 2);
        assert_eq!(image_tokens(336, 336).unwrap(), 12 * 12 + 2);
        assert_eq!(image_tokens(640, 480).unwrap(), 23 * 17 + 2); // 640/28=22.86→23, 480/28=17.14→17
        // half rounds to even: 42/28 = 1.5 → 2, 70/28 = 2.5 → 2
        assert_eq!(smart_resize(42, 70).unwrap(), (56, 56));
        // below min_pixels: scaled up (ceil)
        assert_eq!(smart_resize(10, 10).unwrap(), (56, 56));
        // above max_pixels: scaled down (floor) to within 12845056
        let (h, w) = smart_resize(8000, 8000).unwrap();
        assert!(h * w <= MAX_PIXELS && h % 28 == 0 && w % 28 == 0 && h == w, "{h}x{w}");
        assert_eq!((h, w), (3584, 3584));
        assert!(smart_resize(10, 3000).unwrap_err().contains("aspect ratio"));
    }

    #[test]
    fn data_urls() {
        let f = tiny_png(28, 28);
        let b = base64::engine::general_purpose::STANDARD.encode(&f);
        assert_eq!(data_url(&format!("data:image/png;base64,{b}")).unwrap(), f);
        assert!(data_url("data:image/png;base64,@@@").unwrap_err().contains("base64"));
        assert!(data_url("data:text/plain;base64,aGk=").unwrap_err().contains("not an image"));
        assert!(data_url("data:image/png,raw").unwrap_err().contains("base64"));
    }

    #[tokio::test]
    async fn a_url_with_a_multibyte_character_early_is_refused_not_a_panic() {
        let m = MediaState::new();
        for url in ["abcd€xyz", "€", "data€:", "ht€p://x"] {
            let e = m.load(url).await.unwrap_err();
            assert!(e.contains("neither a data: URL nor http(s)"), "{url}: {e}");
        }
    }

    #[test]
    fn cache_hits_the_same_image_and_stays_bounded() {
        let mut c = MmCache::default();
        assert!(!c.query(1, 10));
        assert!(c.query(1, 10));
        assert!(!c.query(2, CACHE_BYTES / 2));
        assert!(!c.query(3, CACHE_BYTES / 2));
        // last use: 1, 2, 3; inserting 3 overflowed by 10 bytes: the least recent (1) went
        assert!(!c.entries.contains_key(&1));
        assert!(c.used <= CACHE_BYTES);
        assert!(!c.query(4, CACHE_BYTES + 1));
        for i in 0..10_000 {
            c.query(2, 1);
            c.query(100 + i % 3, 1);
        }
        assert!(c.order.len() <= 2 * c.entries.len() + 65);
    }
}

//! Images for multimodal load (probe/README.md, "Images and image masking"): deterministic,
//! seeded RGB pictures of a set size, encoded as PNG, sent as OpenAI `image_url` content parts
//! either inline (`data:image/png;base64,...`) or as URLs of a small HTTP server the bench runs;
//! and the study's image masking (`image_mask_ratio`): an exact fraction of the pixels blacked
//! out in random blocks, re-encoded.

use base64::Engine as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Largest side accepted by `--image-size`.
pub const MAX_SIDE: u32 = 8192;
/// Most images one request may carry (`--images-per-request`).
pub const MAX_PER_REQUEST: usize = 16;
/// Largest `image_mask_ratio` (the study's range is 0–0.3).
pub const MAX_MASK_RATIO: f64 = 0.3;
/// Side of the square blocks the mask is made of (edge blocks are smaller).
pub const MASK_BLOCK: u32 = 16;
/// The colour of masked pixels; generated images never contain it.
pub const MASK_RGB: [u8; 3] = [0, 0, 0];

/// How images travel: inline or by URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageTransport {
    /// `data:image/png;base64,...` inside the request.
    #[default]
    Base64,
    /// `http://…/img/…` served by the bench; the server fetches it.
    Url,
}

/// An image size, `WIDTHxHEIGHT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ImageSize {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

impl ImageSize {
    /// Parses `448x448` (or `448`, a square).
    pub fn parse(s: &str) -> Result<ImageSize, String> {
        let t = s.trim().to_ascii_lowercase();
        let (w, h) = match t.split_once('x') {
            Some((w, h)) => (w.trim(), h.trim()),
            None => (t.as_str(), t.as_str()),
        };
        let side = |v: &str| match v.parse::<u32>() {
            Ok(n) if (1..=MAX_SIDE).contains(&n) => Ok(n),
            _ => Err(format!("--image-size {s:?}: use WIDTHxHEIGHT with sides from 1 to {MAX_SIDE}, e.g. 448x448")),
        };
        Ok(ImageSize { width: side(w)?, height: side(h)? })
    }
}

/// An 8-bit RGB image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Row-major RGB bytes (`width * height * 3`).
    pub pixels: Vec<u8>,
}

impl RgbImage {
    /// Pixels whose colour is [`MASK_RGB`].
    pub fn masked_count(&self) -> u64 {
        self.pixels.chunks_exact(3).filter(|p| *p == MASK_RGB).count() as u64
    }
}

fn image_rng(seed: u64, item: u64, k: usize, salt: u64) -> StdRng {
    StdRng::seed_from_u64(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ item.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ ((k as u64) << 48) ^ salt,
    )
}

/// A deterministic picture for image `k` of prompt `item`: a two-colour gradient with a few
/// filled rectangles and discs, every channel in 16..=255 (so that masking is countable).
pub fn generate(size: ImageSize, seed: u64, item: u64, k: usize) -> RgbImage {
    let mut rng = image_rng(seed, item, k, 0x494D_4147);
    let (w, h) = (size.width, size.height);
    let mut col = || [rng.random_range(16u8..=255), rng.random_range(16u8..=255), rng.random_range(16u8..=255)];
    let (a, b) = (col(), col());
    let mut pixels = Vec::with_capacity(w as usize * h as usize * 3);
    let span = (w + h).max(2) - 2;
    for y in 0..h {
        for x in 0..w {
            let t = ((x + y) * 255).checked_div(span).unwrap_or(0);
            for c in 0..3 {
                let v = (u32::from(a[c]) * (255 - t) + u32::from(b[c]) * t) / 255;
                pixels.push(v as u8);
            }
        }
    }
    let mut img = RgbImage { width: w, height: h, pixels };
    let shapes = rng.random_range(3..8);
    for _ in 0..shapes {
        let c = [rng.random_range(16u8..=255), rng.random_range(16u8..=255), rng.random_range(16u8..=255)];
        let (x0, y0) = (rng.random_range(0..w), rng.random_range(0..h));
        let (sw, sh) = (rng.random_range(1..=w.div_ceil(3)), rng.random_range(1..=h.div_ceil(3)));
        let disc = rng.random_bool(0.5);
        let (cx, cy, r2) = (x0 + sw / 2, y0 + sh / 2, u64::from(sw.min(sh) / 2).pow(2));
        for y in y0..(y0 + sh).min(h) {
            for x in x0..(x0 + sw).min(w) {
                if disc && u64::from(x.abs_diff(cx)).pow(2) + u64::from(y.abs_diff(cy)).pow(2) > r2 {
                    continue;
                }
                let i = (y as usize * w as usize + x as usize) * 3;
                img.pixels[i..i + 3].copy_from_slice(&c);
            }
        }
    }
    img
}

/// Pixels an `image_mask_ratio` of `ratio` masks in an image of `width` × `height`:
/// `round(ratio · width · height)`.
pub fn mask_target(width: u32, height: u32, ratio: f64) -> u64 {
    let area = u64::from(width) * u64::from(height);
    ((ratio.clamp(0.0, 1.0) * area as f64).round() as u64).min(area)
}

/// Masks exactly [`mask_target`] pixels of `img` (set to [`MASK_RGB`]): the image is cut into
/// [`MASK_BLOCK`]² blocks taken in a seeded random order, each filled whole, the last one
/// partly (in raster order). Returns the number of pixels masked.
pub fn mask(img: &mut RgbImage, ratio: f64, seed: u64) -> u64 {
    let target = mask_target(img.width, img.height, ratio);
    let (w, h) = (img.width, img.height);
    let mut blocks: Vec<(u32, u32)> =
        (0..h.div_ceil(MASK_BLOCK)).flat_map(|by| (0..w.div_ceil(MASK_BLOCK)).map(move |bx| (bx, by))).collect();
    blocks.shuffle(&mut StdRng::seed_from_u64(seed ^ 0x4D41_534B));
    let mut left = target;
    for (bx, by) in blocks {
        if left == 0 {
            break;
        }
        for y in by * MASK_BLOCK..((by + 1) * MASK_BLOCK).min(h) {
            for x in bx * MASK_BLOCK..((bx + 1) * MASK_BLOCK).min(w) {
                if left == 0 {
                    break;
                }
                let i = (y as usize * w as usize + x as usize) * 3;
                img.pixels[i..i + 3].copy_from_slice(&MASK_RGB);
                left -= 1;
            }
        }
    }
    target - left
}

/// Encodes as an 8-bit RGB PNG.
pub fn encode_png(img: &RgbImage) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, img.width, img.height);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    e.set_compression(png::Compression::Fast);
    let mut w = e.write_header().map_err(|e| format!("PNG encoding: {e}"))?;
    w.write_image_data(&img.pixels).map_err(|e| format!("PNG encoding: {e}"))?;
    w.finish().map_err(|e| format!("PNG encoding: {e}"))?;
    Ok(out)
}

/// Decodes an 8-bit RGB PNG (what [`encode_png`] writes).
pub fn decode_png(bytes: &[u8]) -> Result<RgbImage, String> {
    let d = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut r = d.read_info().map_err(|e| format!("PNG decoding: {e}"))?;
    let mut buf = vec![0; r.output_buffer_size().ok_or("PNG decoding: image too large")?];
    let info = r.next_frame(&mut buf).map_err(|e| format!("PNG decoding: {e}"))?;
    if info.color_type != png::ColorType::Rgb || info.bit_depth != png::BitDepth::Eight {
        return Err(format!("PNG decoding: {:?}/{:?}, expected 8-bit RGB", info.color_type, info.bit_depth));
    }
    buf.truncate(info.buffer_size());
    Ok(RgbImage { width: info.width, height: info.height, pixels: buf })
}

/// A `data:image/png;base64,...` URL.
pub fn data_url(png: &[u8]) -> String {
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(png))
}

/// The seed of the mask of image `k` of prompt `item`.
fn mask_seed(seed: u64, item: u64, k: usize) -> u64 {
    image_rng(seed, item, k, 0x4D53_4B53).random()
}

/// Image `k` of prompt `item`, masked by `ratio` (0: unmasked), as PNG bytes.
pub fn png_for(size: ImageSize, seed: u64, item: u64, k: usize, ratio: f64) -> Result<Vec<u8>, String> {
    let mut img = generate(size, seed, item, k);
    if ratio > 0.0 {
        mask(&mut img, ratio, mask_seed(seed, item, k));
    }
    encode_png(&img)
}

/// Mask ratios travel in URLs as parts per million.
fn ppm(ratio: f64) -> u64 {
    (ratio.clamp(0.0, 1.0) * 1e6).round() as u64
}

/// The image options of a bench run, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageOptions {
    /// Image size.
    pub size: ImageSize,
    /// Images per request (≥ 1).
    pub per_request: usize,
    /// How they travel.
    pub transport: ImageTransport,
    /// Where the image server binds (URL transport).
    pub bind: String,
    /// The base URL in image URLs, when not the bound address.
    pub base_url: Option<String>,
}

impl ImageOptions {
    /// The image options of `a` (`None`: no images); `--image-mask-ratio` needs images.
    pub fn from_args(a: &crate::BenchArgs) -> Result<Option<ImageOptions>, String> {
        if a.images_per_request == 0 {
            if a.image_mask_ratio.is_some() {
                return Err("--image-mask-ratio needs images: add --images-per-request N".into());
            }
            return Ok(None);
        }
        if a.api != crate::Api::Chat {
            return Err("--images-per-request needs --api chat (image_url content parts)".into());
        }
        if let Some(r) = a.image_mask_ratio {
            crate::perturb::parse_mask_ratio(r)?;
        }
        Ok(Some(ImageOptions {
            size: ImageSize::parse(&a.image_size)?,
            per_request: usize::try_from(a.images_per_request).unwrap_or(MAX_PER_REQUEST).min(MAX_PER_REQUEST),
            transport: a.image_transport,
            bind: a.image_bind.clone(),
            base_url: a.image_base_url.clone(),
        }))
    }

    /// The source of the run's images (starting the image server for the URL transport).
    pub async fn start(&self, seed: u64) -> Result<ImageSource, String> {
        match self.transport {
            ImageTransport::Base64 => Ok(ImageSource::inline(self.size, self.per_request, seed)),
            ImageTransport::Url => {
                ImageSource::served(self.size, self.per_request, seed, &self.bind, self.base_url.as_deref()).await
            }
        }
    }
}

/// The images of a run: their size and number per request, how they travel, and the image
/// server when they travel by URL.
#[derive(Debug)]
pub struct ImageSource {
    size: ImageSize,
    per_request: usize,
    seed: u64,
    transport: ImageTransport,
    base_url: String,
    server: std::sync::Mutex<Option<(tokio::task::JoinHandle<()>, CancellationToken)>>,
}

#[derive(Clone)]
struct ServeState {
    size: ImageSize,
    seed: u64,
}

/// `GET /img/{item}/{k}/{mask_ppm}.png`: the image, generated again from its coordinates.
async fn serve_image(
    axum::extract::State(st): axum::extract::State<Arc<ServeState>>,
    axum::extract::Path((item, k, file)): axum::extract::Path<(u64, usize, String)>,
) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let mask = file.strip_suffix(".png").and_then(|m| m.parse::<u64>().ok());
    let Some(mask) = mask.filter(|&m| m <= 1_000_000) else {
        return (StatusCode::NOT_FOUND, "no such image").into_response();
    };
    if k >= MAX_PER_REQUEST {
        return (StatusCode::NOT_FOUND, "no such image").into_response();
    }
    let (size, seed) = (st.size, st.seed);
    let made = tokio::task::spawn_blocking(move || png_for(size, seed, item, k, mask as f64 / 1e6)).await;
    match made {
        Ok(Ok(bytes)) => ([(header::CONTENT_TYPE, "image/png")], bytes).into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

impl ImageSource {
    /// Images sent inline.
    pub fn inline(size: ImageSize, per_request: usize, seed: u64) -> ImageSource {
        ImageSource {
            size,
            per_request,
            seed,
            transport: ImageTransport::Base64,
            base_url: String::new(),
            server: std::sync::Mutex::new(None),
        }
    }

    /// Images by URL: starts the image server on `bind` (e.g. `127.0.0.1:0`); the URLs name
    /// `base_url` when given (a name the model server can reach), else the bound address.
    pub async fn served(
        size: ImageSize,
        per_request: usize,
        seed: u64,
        bind: &str,
        base_url: Option<&str>,
    ) -> Result<ImageSource, String> {
        let listener =
            tokio::net::TcpListener::bind(bind).await.map_err(|e| format!("--image-bind {bind}: cannot bind: {e}"))?;
        let addr: SocketAddr = listener.local_addr().map_err(|e| format!("--image-bind {bind}: {e}"))?;
        let app = axum::Router::new()
            .route("/img/{item}/{k}/{file}", axum::routing::get(serve_image))
            .with_state(Arc::new(ServeState { size, seed }));
        let stop = CancellationToken::new();
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app).with_graceful_shutdown(async move { s.cancelled().await }).await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "image server stopped");
            }
        });
        let base_url = match base_url {
            Some(b) => b.trim_end_matches('/').to_string(),
            None => format!("http://{addr}"),
        };
        tracing::info!(%base_url, "serving images");
        Ok(ImageSource {
            size,
            per_request,
            seed,
            transport: ImageTransport::Url,
            base_url,
            server: std::sync::Mutex::new(Some((task, stop))),
        })
    }

    /// The image size.
    pub fn size(&self) -> ImageSize {
        self.size
    }

    /// Images per request.
    pub fn per_request(&self) -> usize {
        self.per_request
    }

    /// How images travel.
    pub fn transport(&self) -> ImageTransport {
        self.transport
    }

    /// The URLs (data or http) of prompt `item`'s images, masked by `mask_ratio` (0: none).
    pub fn urls(&self, item: u64, mask_ratio: f64) -> Result<Vec<String>, String> {
        (0..self.per_request)
            .map(|k| match self.transport {
                ImageTransport::Base64 => png_for(self.size, self.seed, item, k, mask_ratio).map(|p| data_url(&p)),
                ImageTransport::Url => Ok(format!("{}/img/{item}/{k}/{}.png", self.base_url, ppm(mask_ratio))),
            })
            .collect()
    }

    /// Stops the image server (inline images: nothing to do).
    pub async fn shutdown(&self) {
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((task, stop)) = server {
            stop.cancel();
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ImageSize::parse("448x336").unwrap(), ImageSize { width: 448, height: 336 });
        assert_eq!(ImageSize::parse("224").unwrap(), ImageSize { width: 224, height: 224 });
        assert!(ImageSize::parse("0x10").is_err());
        assert!(ImageSize::parse("axb").is_err());
        assert!(ImageSize::parse("9000x10").is_err());
    }

    #[test]
    fn png_roundtrip_is_deterministic() {
        let size = ImageSize { width: 61, height: 47 };
        let a = generate(size, 3, 7, 0);
        assert_eq!(a, generate(size, 3, 7, 0));
        assert_ne!(a, generate(size, 3, 7, 1));
        assert_ne!(a, generate(size, 3, 8, 0));
        assert_eq!(a.masked_count(), 0, "generated images never contain the mask colour");
        let p = encode_png(&a).unwrap();
        assert!(p.starts_with(b"\x89PNG\r\n\x1a\n"));
        // IHDR: width and height right after the chunk type
        assert_eq!(&p[16..24], &[0, 0, 0, 61, 0, 0, 0, 47]);
        assert_eq!(decode_png(&p).unwrap(), a);
    }

    #[test]
    fn masking_area_is_exact() {
        let size = ImageSize { width: 448, height: 448 };
        for (ratio, want) in [(0.0, 0u64), (0.1, 20_070), (0.15, 30_106), (0.3, 60_211)] {
            let orig = generate(size, 1, 2, 0);
            let mut m = orig.clone();
            let n = mask(&mut m, ratio, 99);
            assert_eq!(n, want, "ratio {ratio}");
            assert_eq!(mask_target(448, 448, ratio), want);
            // real pixels, re-encoded: decode the PNG and count
            let back = decode_png(&encode_png(&m).unwrap()).unwrap();
            assert_eq!(back.masked_count(), want, "ratio {ratio}");
            let unchanged = back
                .pixels
                .chunks_exact(3)
                .zip(orig.pixels.chunks_exact(3))
                .filter(|(b, o)| *b != MASK_RGB && b == o)
                .count() as u64;
            assert_eq!(unchanged, 448 * 448 - want, "unmasked pixels are untouched");
        }
        // odd sizes (partial edge blocks) and a seeded, block-shaped layout
        let mut m = generate(ImageSize { width: 37, height: 23 }, 0, 0, 0);
        assert_eq!(mask(&mut m, 0.25, 5), mask_target(37, 23, 0.25));
        assert_eq!(m.masked_count(), (0.25f64 * 37.0 * 23.0).round() as u64);
        let (mut x, mut y) = (generate(size, 1, 2, 0), generate(size, 1, 2, 0));
        mask(&mut x, 0.2, 1);
        mask(&mut y, 0.2, 2);
        assert_ne!(x, y, "the mask layout follows its seed");
    }

    #[test]
    fn urls_per_transport() {
        let size = ImageSize { width: 28, height: 28 };
        let s = ImageSource::inline(size, 2, 0);
        let u = s.urls(5, 0.0).unwrap();
        assert_eq!(u.len(), 2);
        assert!(u[0].starts_with("data:image/png;base64,"));
        assert_ne!(u[0], u[1]);
        assert_ne!(s.urls(5, 0.3).unwrap()[0], u[0]);
        let png = base64::engine::general_purpose::STANDARD.decode(&u[0]["data:image/png;base64,".len()..]).unwrap();
        assert_eq!(decode_png(&png).unwrap(), generate(size, 0, 5, 0));
    }

    #[tokio::test]
    async fn image_server_serves_what_inline_sends() {
        crate::client::install_crypto_provider();
        let size = ImageSize { width: 40, height: 30 };
        let s = ImageSource::served(size, 1, 9, "127.0.0.1:0", None).await.unwrap();
        let url = &s.urls(4, 0.2).unwrap()[0];
        assert!(url.ends_with("/img/4/0/200000.png"), "{url}");
        let got = reqwest::get(url).await.unwrap();
        assert_eq!(got.status(), 200);
        let body = got.bytes().await.unwrap();
        assert_eq!(body.as_ref(), png_for(size, 9, 4, 0, 0.2).unwrap().as_slice());
        let bad = url.replace("200000.png", "x.png");
        assert_eq!(reqwest::get(&bad).await.unwrap().status(), 404);
        s.shutdown().await;
    }
}

//! Record framing of the persistent queue.
//!
//! A frame is `MAGIC u32 | len u32 | crc u32 | body[len]` (little-endian); `crc` is the CRC-32
//! (IEEE) of `len` and `body`. The magic lets recovery find the next frame after a damaged one.
//! The body is `version u8 | signal u8 | index u64 | items u32 | meta_len u32 | meta | payload`,
//! `payload` being the OTLP protobuf export request and `meta` the client metadata.

use crate::auth::{AuthInfo, ClientInfo};
use crate::pdata::Signal;

/// Marks the start of a frame ("IWQ1").
pub(crate) const MAGIC: u32 = 0x3151_5749;
/// Bytes before the body.
pub(crate) const HEADER: usize = 12;
/// Largest body accepted when reading (a larger length is damage).
pub(crate) const MAX_BODY: usize = 1 << 30;
const VERSION: u8 = 1;
/// Bytes of the body before `meta`.
const BODY_FIXED: usize = 1 + 1 + 8 + 4 + 4;
/// Header names never written to disk: credentials stay in memory only.
const NOT_PERSISTED: [&str; 3] = ["authorization", "proxy-authorization", "cookie"];

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32 (IEEE 802.3) continuing from `crc` (start with 0).
pub(crate) fn crc32(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in data {
        c = CRC_TABLE[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
    }
    !c
}

/// One decoded record.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// Position in the queue (strictly increasing).
    pub index: u64,
    /// The signal of `payload`.
    pub signal: Signal,
    /// Items in `payload`.
    pub items: u32,
    /// Client metadata as persisted.
    pub client: Option<ClientInfo>,
    /// OTLP protobuf export request.
    pub payload: Vec<u8>,
}

fn signal_code(s: Signal) -> u8 {
    match s {
        Signal::Traces => 0,
        Signal::Metrics => 1,
        Signal::Logs => 2,
    }
}

fn signal_of(c: u8) -> Option<Signal> {
    match c {
        0 => Some(Signal::Traces),
        1 => Some(Signal::Metrics),
        2 => Some(Signal::Logs),
        _ => None,
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    let n = s.len().min(u16::MAX as usize);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&s[..n]);
}

/// Encodes client metadata (credential headers left out); empty when there is none.
fn encode_meta(c: Option<&ClientInfo>) -> Vec<u8> {
    let Some(c) = c else { return Vec::new() };
    let mut out = vec![1u8];
    put_str(&mut out, c.addr.map(|a| a.to_string()).unwrap_or_default().as_bytes());
    match c.auth.as_ref() {
        Some(a) => {
            out.push(1);
            put_str(&mut out, a.subject.as_deref().unwrap_or("").as_bytes());
            out.push(u8::from(a.subject.is_some()));
        }
        None => out.push(0),
    }
    let kept: Vec<_> = c.metadata.iter().filter(|(k, _)| !NOT_PERSISTED.contains(&k.as_str())).take(1024).collect();
    out.extend_from_slice(&(kept.len() as u16).to_le_bytes());
    for (k, v) in kept {
        put_str(&mut out, k.as_str().as_bytes());
        put_str(&mut out, v.as_bytes());
    }
    out
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
    }
    fn str(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }
}

fn decode_meta(m: &[u8]) -> Option<Option<ClientInfo>> {
    if m.is_empty() {
        return Some(None);
    }
    let mut c = Cursor(m);
    if c.u8()? != 1 {
        return None;
    }
    let addr = std::str::from_utf8(c.str()?).ok()?;
    let mut info = ClientInfo { addr: addr.parse().ok(), ..Default::default() };
    if c.u8()? == 1 {
        let subject = String::from_utf8(c.str()?.to_vec()).ok()?;
        let has = c.u8()? == 1;
        info.auth = Some(AuthInfo { subject: has.then_some(subject) });
    }
    let n = c.u16()?;
    for _ in 0..n {
        let k = http::HeaderName::from_bytes(c.str()?).ok()?;
        let v = http::HeaderValue::from_bytes(c.str()?).ok()?;
        info.metadata.append(k, v);
    }
    Some(Some(info))
}

/// Encodes one framed record.
pub(crate) fn encode(index: u64, signal: Signal, items: u32, client: Option<&ClientInfo>, payload: &[u8]) -> Vec<u8> {
    let meta = encode_meta(client);
    let len = BODY_FIXED + meta.len() + payload.len();
    let mut out = Vec::with_capacity(HEADER + len);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(VERSION);
    out.push(signal_code(signal));
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&items.to_le_bytes());
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(payload);
    let crc = crc32(crc32(0, &out[4..8]), &out[HEADER..]);
    out[8..12].copy_from_slice(&crc.to_le_bytes());
    out
}

/// What is at the start of a buffer.
#[derive(Debug)]
pub(crate) enum Frame {
    /// A valid record spanning `len` bytes.
    Ok(Record, usize),
    /// The buffer ends inside the frame (a torn write when at the end of a file).
    Incomplete,
    /// Not a valid frame.
    Bad,
}

/// Decodes the frame at the start of `buf`.
pub(crate) fn decode(buf: &[u8]) -> Frame {
    if buf.len() < HEADER {
        // A short prefix of a frame (or of its magic) is a torn write; anything else is damage.
        let m = MAGIC.to_le_bytes();
        let n = buf.len().min(4);
        return if buf[..n] == m[..n] { Frame::Incomplete } else { Frame::Bad };
    }
    let mut c = Cursor(buf);
    let (Some(magic), Some(len), Some(crc)) = (c.u32(), c.u32(), c.u32()) else { return Frame::Bad };
    let len = len as usize;
    if magic != MAGIC || !(BODY_FIXED..=MAX_BODY).contains(&len) {
        return Frame::Bad;
    }
    let Some(body) = c.take(len) else { return Frame::Incomplete };
    if crc32(crc32(0, &buf[4..8]), body) != crc {
        return Frame::Bad;
    }
    match decode_body(body) {
        Some(r) => Frame::Ok(r, HEADER + len),
        None => Frame::Bad,
    }
}

fn decode_body(body: &[u8]) -> Option<Record> {
    let mut c = Cursor(body);
    if c.u8()? != VERSION {
        return None;
    }
    let signal = signal_of(c.u8()?)?;
    let index = c.u64()?;
    let items = c.u32()?;
    let meta_len = c.u32()? as usize;
    let client = decode_meta(c.take(meta_len)?)?;
    Some(Record { index, signal, items, client, payload: c.0.to_vec() })
}

/// The offset of the next possible frame start after `from` (by its magic), if any.
pub(crate) fn resync(buf: &[u8], from: usize) -> Option<usize> {
    let m = MAGIC.to_le_bytes();
    (from..buf.len().saturating_sub(3)).find(|&i| buf[i..i + 4] == m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn crc_known_value() {
        assert_eq!(crc32(0, b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn client_metadata_round_trips_without_credentials() {
        let mut info = ClientInfo {
            addr: Some("10.0.0.1:4317".parse().unwrap()),
            auth: Some(AuthInfo { subject: Some("alice".into()) }),
            ..Default::default()
        };
        info.metadata.insert("x-scope-orgid", "tenant-a".parse().unwrap());
        info.metadata.insert("authorization", "Bearer secret".parse().unwrap());
        let f = encode(7, Signal::Logs, 3, Some(&info), b"payload");
        let Frame::Ok(r, n) = decode(&f) else { panic!("not decoded") };
        assert_eq!(n, f.len());
        let c = r.client.unwrap();
        assert_eq!(c.addr, info.addr);
        assert_eq!(c.auth, info.auth);
        assert_eq!(c.metadata_values("x-scope-orgid"), vec!["tenant-a"]);
        assert!(c.metadata.get("authorization").is_none(), "credentials are not persisted");
        assert!(!f.windows(6).any(|w| w == b"secret"));
    }

    proptest! {
        #[test]
        fn framing_round_trips(index: u64, items: u32, payload in proptest::collection::vec(any::<u8>(), 0..300),
                               tenant in "[a-z]{0,12}") {
            let mut info = ClientInfo::default();
            if !tenant.is_empty() {
                info.metadata.insert("x-tenant", tenant.parse().unwrap());
            }
            let f = encode(index, Signal::Traces, items, Some(&info), &payload);
            let Frame::Ok(r, n) = decode(&f) else { panic!("not decoded") };
            prop_assert_eq!(n, f.len());
            prop_assert_eq!((r.index, r.items, r.signal, &r.payload), (index, items, Signal::Traces, &payload));
            // Every cut is incomplete, never a wrong record.
            for cut in 0..f.len() {
                prop_assert!(matches!(decode(&f[..cut]), Frame::Incomplete), "cut at {}", cut);
            }
        }

        #[test]
        fn any_byte_flip_is_detected(payload in proptest::collection::vec(any::<u8>(), 0..200),
                                     at: prop::sample::Index, bit in 0u8..8) {
            let mut f = encode(42, Signal::Metrics, 1, None, &payload);
            let i = at.index(f.len());
            f[i] ^= 1 << bit;
            prop_assert!(!matches!(decode(&f), Frame::Ok(..)), "flip at {} undetected", i);
        }
    }
}

//! Decompression with a budget: request bodies are inflated chunk by chunk, each request up to
//! its own limit (a bomb is refused as soon as it crosses it, never inflated fully first), and
//! all requests together up to a process-wide budget of bytes being inflated or held
//! decompressed. A request over the budget waits briefly for room, then is refused with a
//! retryable error (429 / RESOURCE_EXHAUSTED). `memory_limiter` adds [`inflight_bytes`] to
//! the memory it measures, so it refuses before those bytes show up in the RSS.

use bytes::{Bytes, BytesMut};
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::sync::Notify;

/// Bytes inflated per step (the overshoot past a limit is at most this).
pub const CHUNK: usize = 64 * 1024;
/// Default process-wide budget of decompressed bytes in flight.
pub const DEFAULT_BUDGET: usize = 128 * 1024 * 1024;
/// How long a request waits for room in the budget before it is refused.
pub const DEFAULT_BUDGET_WAIT: Duration = Duration::from_millis(250);

/// A budget of bytes shared by concurrent decompressions.
pub struct InflateBudget {
    capacity: AtomicUsize,
    used: AtomicUsize,
    freed: Notify,
}

static GLOBAL: LazyLock<Arc<InflateBudget>> = LazyLock::new(|| InflateBudget::new(DEFAULT_BUDGET));

/// The process-wide budget every listener draws from.
pub fn global() -> Arc<InflateBudget> {
    GLOBAL.clone()
}

/// Bytes of the process-wide budget now reserved (decompressed request bodies in flight).
pub fn inflight_bytes() -> usize {
    GLOBAL.used()
}

/// Why a reservation was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many bytes are being decompressed concurrently (budget {capacity} bytes); retry later")]
pub struct BudgetExhausted {
    /// The budget's capacity.
    pub capacity: usize,
}

impl InflateBudget {
    /// A budget of `capacity` bytes.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(InflateBudget {
            capacity: AtomicUsize::new(capacity),
            used: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    /// Changes the capacity (reservations already granted stay).
    pub fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity, Ordering::Release);
        self.freed.notify_waiters();
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Acquire)
    }

    fn try_take(&self, n: usize) -> bool {
        let cap = self.capacity();
        self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_add(n).filter(|&t| t <= cap)).is_ok()
    }

    fn give_back(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
            self.freed.notify_waiters();
        }
    }

    /// An empty reservation to grow as bytes are inflated.
    pub fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation { budget: self.clone(), bytes: 0 }
    }
}

/// Bytes held against a budget; given back on drop.
pub struct Reservation {
    budget: Arc<InflateBudget>,
    bytes: usize,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation").field("bytes", &self.bytes).finish()
    }
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `n` more bytes, waiting up to `wait` for room.
    pub async fn grow(&mut self, n: usize, wait: Duration) -> Result<(), BudgetExhausted> {
        if self.budget.try_take(n) {
            self.bytes += n;
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let freed = self.budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.budget.try_take(n) {
                self.bytes += n;
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(BudgetExhausted { capacity: self.budget.capacity() });
            }
        }
    }

    /// Gives back what is held beyond `n` bytes.
    pub fn shrink_to(&mut self, n: usize) {
        if n < self.bytes {
            self.budget.give_back(self.bytes - n);
            self.bytes = n;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// A `Content-Encoding` the listeners decode (otelcol confighttp's set, less lz4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentEncoding {
    /// No encoding.
    Identity,
    /// gzip (one or more members).
    Gzip,
    /// zlib-wrapped deflate (`deflate`, as HTTP defines it) or `zlib`.
    Deflate,
    /// Zstandard.
    Zstd,
    /// Snappy block format (`snappy`).
    Snappy,
    /// Snappy framing format (`x-snappy-framed`).
    SnappyFramed,
}

impl ContentEncoding {
    /// The encoding named by a `Content-Encoding` value; `None` when it is not supported.
    pub fn parse(v: Option<&str>) -> Option<Self> {
        let Some(v) = v.map(str::trim) else { return Some(ContentEncoding::Identity) };
        Some(match v.to_ascii_lowercase().as_str() {
            "" | "identity" => ContentEncoding::Identity,
            "gzip" | "x-gzip" => ContentEncoding::Gzip,
            "deflate" | "zlib" => ContentEncoding::Deflate,
            "zstd" => ContentEncoding::Zstd,
            "snappy" => ContentEncoding::Snappy,
            "x-snappy-framed" => ContentEncoding::SnappyFramed,
            _ => return None,
        })
    }
}

/// Why a body could not be decompressed.
#[derive(Debug, thiserror::Error)]
pub enum InflateError {
    /// The decompressed body crossed the per-request limit (inflation stopped there).
    #[error("request body larger than the limit of {limit} bytes after decompression")]
    TooLarge {
        /// The limit.
        limit: usize,
        /// Bytes inflated before stopping (at most `limit` + [`CHUNK`]).
        inflated: usize,
    },
    /// The process-wide budget had no room.
    #[error(transparent)]
    Budget(#[from] BudgetExhausted),
    /// The compressed data is corrupt.
    #[error("failed to read the request body: cannot decompress it ({encoding:?}): {message}")]
    Corrupt {
        /// The encoding.
        encoding: ContentEncoding,
        /// The decoder's message.
        message: String,
    },
}

/// Inflates `compressed` as `encoding`, refusing more than `limit` decompressed bytes and
/// holding every decompressed byte against `reservation` (grown as it goes).
pub async fn inflate(
    compressed: Bytes,
    encoding: ContentEncoding,
    limit: usize,
    reservation: &mut Reservation,
    wait: Duration,
) -> Result<Bytes, InflateError> {
    let corrupt = |e: std::io::Error| InflateError::Corrupt { encoding, message: e.to_string() };
    let mut reader: Box<dyn Read + Send> = match encoding {
        ContentEncoding::Identity => {
            if compressed.len() > limit {
                return Err(InflateError::TooLarge { limit, inflated: 0 });
            }
            return Ok(compressed);
        }
        ContentEncoding::Snappy => {
            // The block format states its length up front: refuse before inflating anything.
            let n = snap::raw::decompress_len(&compressed)
                .map_err(|e| InflateError::Corrupt { encoding, message: e.to_string() })?;
            if n > limit {
                return Err(InflateError::TooLarge { limit, inflated: 0 });
            }
            reservation.grow(n, wait).await?;
            let out = snap::raw::Decoder::new()
                .decompress_vec(&compressed)
                .map_err(|e| InflateError::Corrupt { encoding, message: e.to_string() })?;
            return Ok(Bytes::from(out));
        }
        ContentEncoding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(std::io::Cursor::new(compressed))),
        ContentEncoding::Deflate => Box::new(flate2::read::ZlibDecoder::new(std::io::Cursor::new(compressed))),
        ContentEncoding::Zstd => {
            Box::new(zstd::stream::read::Decoder::new(std::io::Cursor::new(compressed)).map_err(corrupt)?)
        }
        ContentEncoding::SnappyFramed => Box::new(snap::read::FrameDecoder::new(std::io::Cursor::new(compressed))),
    };
    let mut out = BytesMut::new();
    let mut since_yield = 0usize;
    loop {
        let start = out.len();
        out.resize(start + CHUNK, 0);
        let n = match reader.read(&mut out[start..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(corrupt(e)),
        };
        out.truncate(start + n);
        if n == 0 {
            break;
        }
        if out.len() > limit {
            return Err(InflateError::TooLarge { limit, inflated: out.len() });
        }
        reservation.grow(n, wait).await?;
        since_yield += n;
        if since_yield >= 1024 * 1024 {
            since_yield = 0;
            tokio::task::yield_now().await;
        }
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(b: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(b).unwrap();
        Bytes::from(e.finish().unwrap())
    }

    #[tokio::test]
    async fn bombs_stop_at_the_limit_plus_one_chunk() {
        let budget = InflateBudget::new(1 << 30);
        let limit = 1024 * 1024;
        // 64 MiB of zeros: about 64 KiB compressed.
        let bomb_plain = vec![0u8; 64 * 1024 * 1024];
        let gz = gzip(&bomb_plain);
        let zs = Bytes::from(zstd::encode_all(&bomb_plain[..], 19).unwrap());
        let mut framed = Vec::new();
        snap::write::FrameEncoder::new(&mut framed).write_all(&bomb_plain).unwrap();
        let block = Bytes::from(snap::raw::Encoder::new().compress_vec(&bomb_plain).unwrap());
        for (enc, body) in [
            (ContentEncoding::Gzip, gz),
            (ContentEncoding::Zstd, zs),
            (ContentEncoding::SnappyFramed, Bytes::from(framed)),
            (ContentEncoding::Snappy, block),
        ] {
            let mut r = budget.reservation();
            let e = inflate(body, enc, limit, &mut r, Duration::ZERO).await.unwrap_err();
            let InflateError::TooLarge { inflated, .. } = e else { panic!("{enc:?}: {e}") };
            assert!(inflated <= limit + CHUNK, "{enc:?} inflated {inflated}");
            assert!(r.bytes() <= limit, "{enc:?} reserved {}", r.bytes());
            drop(r);
            assert_eq!(budget.used(), 0);
        }
    }

    #[tokio::test]
    async fn budget_is_shared_and_refuses_after_the_wait() {
        let budget = InflateBudget::new(3 * CHUNK);
        let body = gzip(&vec![7u8; 2 * CHUNK]);
        let mut a = budget.reservation();
        let out = inflate(body.clone(), ContentEncoding::Gzip, 1 << 20, &mut a, Duration::ZERO).await.unwrap();
        assert_eq!(out.len(), 2 * CHUNK);
        assert_eq!(budget.used(), 2 * CHUNK);
        let mut b = budget.reservation();
        let e = inflate(body.clone(), ContentEncoding::Gzip, 1 << 20, &mut b, Duration::from_millis(20)).await;
        assert!(matches!(e, Err(InflateError::Budget(_))), "{e:?}");
        drop(b);
        // Room made while waiting is taken.
        let waiter = {
            let budget = budget.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut c = budget.reservation();
                inflate(body, ContentEncoding::Gzip, 1 << 20, &mut c, Duration::from_secs(5)).await.map(|b| b.len())
            })
        };
        tokio::task::yield_now().await;
        drop(a);
        assert_eq!(waiter.await.unwrap().unwrap(), 2 * CHUNK);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn corrupt_and_identity() {
        let budget = InflateBudget::new(1 << 20);
        let mut r = budget.reservation();
        let e = inflate(Bytes::from_static(b"not gzip"), ContentEncoding::Gzip, 100, &mut r, Duration::ZERO).await;
        assert!(matches!(e, Err(InflateError::Corrupt { .. })));
        let ok = inflate(Bytes::from_static(b"abc"), ContentEncoding::Identity, 3, &mut r, Duration::ZERO).await;
        assert_eq!(ok.unwrap(), Bytes::from_static(b"abc"));
        assert!(
            inflate(Bytes::from_static(b"abcd"), ContentEncoding::Identity, 3, &mut r, Duration::ZERO).await.is_err()
        );
        assert_eq!(ContentEncoding::parse(Some("GZIP")), Some(ContentEncoding::Gzip));
        assert_eq!(ContentEncoding::parse(Some("br")), None);
        assert_eq!(ContentEncoding::parse(None), Some(ContentEncoding::Identity));
    }
}

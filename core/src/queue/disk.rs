//! The persistent queue of one exporter and signal: a directory of append-only segment files of
//! framed records (see [`super::record`]) and a small `state` file replaced atomically (write a
//! temporary file, rename it) that says which records are done.
//!
//! The state is `R` (every record at or above it is still to be sent) and `L` (the records below
//! `R` still live: being sent, or resumed after a restart and not yet sent). A record is handed
//! to a worker in index order and its completion removes it from `L`; out-of-order completions
//! are fine. On restart the records in `L` are sent again (at least once: they may have been
//! delivered just before the crash) and counted as redelivered; `L` holds at most what was in
//! flight. A segment whose records are all done is deleted.

use super::record::{self, Frame, Record};
use crate::auth::ClientInfo;
use crate::pdata::{Encoded, Payload, Signal};
use crate::settings::QueueSizer;
use crate::telemetry::ExporterMetrics;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A segment is closed for appends once it is this large.
const SEGMENT_MAX: u64 = 8 << 20;
/// Payloads kept decoded in memory for the workers, at most (the rest is read back from disk).
const READ_AHEAD_BYTES: usize = 32 << 20;
const STATE_MAGIC: &[u8; 4] = b"IWQS";

/// How a queue directory is opened.
#[derive(Debug, Clone)]
pub(crate) struct DiskOptions {
    /// Sync appended records to the device before acknowledging them.
    pub fsync: bool,
    /// How long to wait for another holder of the directory lock.
    pub lock_timeout: Duration,
    /// What capacity units count.
    pub sizer: QueueSizer,
}

/// A record handed to a worker.
pub(crate) struct DiskJob {
    pub index: u64,
    pub payload: Payload,
    pub client: Option<Arc<ClientInfo>>,
    pub units: u64,
}

struct Slot {
    index: u64,
    seg: u64,
    offset: u64,
    len: usize,
    units: u64,
    cached: Option<Payload>,
    cached_bytes: usize,
    client: Option<Arc<ClientInfo>>,
}

struct Writer {
    file: Arc<File>,
    seg: u64,
    len: u64,
    next_index: u64,
    /// The last append failed and could not be rolled back: start a new segment.
    broken: bool,
    /// Appends so far (for group fsync).
    written: u64,
}

struct Meta {
    pending: VecDeque<Slot>,
    r: u64,
    live_below: BTreeSet<u64>,
    segments: BTreeMap<u64, Arc<File>>,
    cached_bytes: usize,
    /// The state file could not be written (logged once until it recovers).
    state_failing: bool,
}

/// What [`DiskQueue::open`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resumed {
    /// Records resumed.
    pub records: u64,
    /// Items in them.
    pub items: u64,
    /// Capacity units they occupy.
    pub units: u64,
    /// Of those, items that were being sent at the stop (possible duplicates).
    pub redelivered_items: u64,
    /// Records of those.
    pub redelivered_records: u64,
}

/// The persistent queue of one exporter and signal.
pub(crate) struct DiskQueue {
    dir: PathBuf,
    name: String,
    signal: Signal,
    opts: DiskOptions,
    metrics: ExporterMetrics,
    w: Mutex<Writer>,
    synced: Mutex<u64>,
    meta: Mutex<Meta>,
    _lock: File,
    #[cfg(test)]
    pub(crate) fail_writes: std::sync::atomic::AtomicBool,
}

fn now_ts() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn seg_name(id: u64) -> String {
    format!("seg-{id:020}.log")
}

/// Moves `path` aside as `<path>.corrupt-<unix-ts>`; returns the new name.
fn quarantine(path: &Path) -> io::Result<PathBuf> {
    let mut to = path.as_os_str().to_owned();
    to.push(format!(".corrupt-{}", now_ts()));
    let mut to = PathBuf::from(to);
    let mut n = 1;
    while to.exists() {
        let mut t = path.as_os_str().to_owned();
        t.push(format!(".corrupt-{}-{n}", now_ts()));
        to = PathBuf::from(t);
        n += 1;
    }
    fs::rename(path, &to)?;
    Ok(to)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn units_of(sizer: QueueSizer, items: u64, bytes: usize) -> u64 {
    match sizer {
        QueueSizer::Requests => 1,
        QueueSizer::Items => items,
        QueueSizer::Bytes => bytes as u64,
    }
}

/// Rebuilds a payload from its persisted protobuf.
fn payload_of(r: Record) -> Option<Payload> {
    use prost::Message;
    let bytes = bytes::Bytes::from(r.payload);
    if let Ok(e) = Encoded::new(r.signal, bytes.clone()) {
        return Some(Payload::Encoded(e));
    }
    use opentelemetry_proto::tonic::collector as c;
    match r.signal {
        Signal::Traces => c::trace::v1::ExportTraceServiceRequest::decode(bytes).ok().map(Payload::Traces),
        Signal::Metrics => c::metrics::v1::ExportMetricsServiceRequest::decode(bytes).ok().map(Payload::Metrics),
        Signal::Logs => c::logs::v1::ExportLogsServiceRequest::decode(bytes).ok().map(Payload::Logs),
    }
}

fn encode_state(r: u64, live: &BTreeSet<u64>) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + live.len() * 8);
    v.extend_from_slice(STATE_MAGIC);
    v.extend_from_slice(&r.to_le_bytes());
    v.extend_from_slice(&(live.len() as u32).to_le_bytes());
    for i in live {
        v.extend_from_slice(&i.to_le_bytes());
    }
    let crc = record::crc32(0, &v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

fn decode_state(b: &[u8]) -> Option<(u64, BTreeSet<u64>)> {
    if b.len() < 20 || &b[..4] != STATE_MAGIC {
        return None;
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if record::crc32(0, body) != u32::from_le_bytes(crc.try_into().ok()?) {
        return None;
    }
    let r = u64::from_le_bytes(body[4..12].try_into().ok()?);
    let n = u32::from_le_bytes(body[12..16].try_into().ok()?) as usize;
    if body.len() != 16 + n * 8 {
        return None;
    }
    let live = body[16..].chunks_exact(8).filter_map(|c| c.try_into().ok().map(u64::from_le_bytes)).collect();
    Some((r, live))
}

/// What a segment scan found.
struct Scan {
    /// Valid records with their frame offset and length.
    good: Vec<(Record, u64, usize)>,
    /// Damaged bytes followed by valid records (or in a closed segment).
    corrupt: bool,
    /// Offset of a torn final frame of the last segment.
    torn_at: Option<u64>,
}

fn scan(buf: &[u8], last_segment: bool, mut min_index: Option<u64>) -> Scan {
    let mut s = Scan { good: Vec::new(), corrupt: false, torn_at: None };
    let mut off = 0usize;
    let mut bad_start: Option<usize> = None;
    while off < buf.len() {
        match record::decode(&buf[off..]) {
            Frame::Ok(r, n) if min_index.is_none_or(|m| r.index >= m) => {
                if bad_start.take().is_some() {
                    s.corrupt = true;
                }
                min_index = Some(r.index + 1);
                s.good.push((r, off as u64, n));
                off += n;
            }
            Frame::Incomplete if bad_start.is_none() => {
                bad_start = Some(off);
                break;
            }
            _ => {
                bad_start.get_or_insert(off);
                match record::resync(buf, off + 1) {
                    Some(next) => off = next,
                    None => break,
                }
            }
        }
    }
    if let Some(b) = bad_start {
        // Damage running to the end of the file: a torn write if this is where appends go.
        if last_segment && !s.corrupt {
            s.torn_at = Some(b as u64);
        } else {
            s.corrupt = true;
        }
    }
    s
}

impl DiskQueue {
    /// Opens (or creates) the queue in `dir`, repairing what a crash left, and says what it resumed.
    pub(crate) fn open(
        dir: &Path,
        opts: DiskOptions,
        metrics: ExporterMetrics,
        name: &str,
        signal: Signal,
    ) -> Result<(DiskQueue, Resumed), String> {
        let what = |e: io::Error, doing: &str| format!("persistent queue {}: {doing}: {e}", dir.display());
        if dir.exists() && fs::read_dir(dir).is_err() {
            let to = quarantine(dir).map_err(|e| what(e, "unreadable and cannot be moved aside"))?;
            metrics.queue_quarantined.inc();
            tracing::warn!(exporter = name, signal = %signal, moved_to = %to.display(),
                "persistent queue directory unreadable; moved aside, starting with an empty queue");
        }
        {
            let mut b = fs::DirBuilder::new();
            b.recursive(true);
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o750);
            b.create(dir).map_err(|e| what(e, "cannot create the directory"))?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(|e| what(e, "cannot create the lock file"))?;
        let start = Instant::now();
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) if start.elapsed() < opts.lock_timeout => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(format!("persistent queue {}: in use by another process (timeout)", dir.display()));
                }
                Err(fs::TryLockError::Error(e)) => return Err(what(e, "cannot lock")),
            }
        }
        // The state: what is done.
        let state_path = dir.join("state");
        let state = match fs::read(&state_path) {
            Ok(b) => match decode_state(&b) {
                Some(s) => Some(s),
                None => {
                    metrics.queue_quarantined.inc();
                    let to = quarantine(&state_path).map(|p| p.display().to_string()).unwrap_or_default();
                    tracing::warn!(exporter = name, signal = %signal, moved_to = %to,
                        "persistent queue state file corrupt; moved aside; every queued record will be sent again");
                    None
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                metrics.queue_quarantined.inc();
                let to = quarantine(&state_path).map(|p| p.display().to_string()).unwrap_or_default();
                tracing::warn!(exporter = name, signal = %signal, error = %e, moved_to = %to,
                    "persistent queue state file unreadable; moved aside; every queued record will be sent again");
                None
            }
        };
        let state_known = state.is_some();
        let (r_old, live_old) = state.unwrap_or((0, BTreeSet::new()));
        let is_live = |i: u64| i >= r_old || live_old.contains(&i);

        let mut seg_ids: Vec<u64> = fs::read_dir(dir)
            .map_err(|e| what(e, "cannot list"))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                n.strip_prefix("seg-")?.strip_suffix(".log")?.parse().ok()
            })
            .collect();
        seg_ids.sort_unstable();

        let mut pending = VecDeque::new();
        let mut segments = BTreeMap::new();
        let mut resumed = Resumed::default();
        let mut max_index: Option<u64> = None;
        let mut cursor: Option<u64> = None;
        let n_seg = seg_ids.len();
        for (k, &id) in seg_ids.iter().enumerate() {
            let path = dir.join(seg_name(id));
            let last = k + 1 == n_seg;
            let buf = match fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    metrics.queue_quarantined.inc();
                    let to = quarantine(&path).map(|p| p.display().to_string()).unwrap_or_default();
                    tracing::warn!(exporter = name, signal = %signal, error = %e, moved_to = %to,
                        "persistent queue segment unreadable; moved aside, its records are lost");
                    continue;
                }
            };
            let sc = scan(&buf, last, cursor);
            let mut good = sc.good;
            if sc.corrupt {
                // Keep the valid records: move the file aside and write them back.
                metrics.queue_quarantined.inc();
                let to = quarantine(&path).map_err(|e| what(e, "cannot move a corrupt segment aside"))?;
                let mut f = File::create(&path).map_err(|e| what(e, "cannot rewrite a corrupt segment"))?;
                let mut off = 0u64;
                for (_, o, n) in good.iter_mut() {
                    let (from, len) = (*o as usize, *n);
                    f.write_all(&buf[from..from + len]).map_err(|e| what(e, "cannot rewrite a corrupt segment"))?;
                    *o = off;
                    off += len as u64;
                }
                f.sync_all().map_err(|e| what(e, "cannot rewrite a corrupt segment"))?;
                tracing::warn!(exporter = name, signal = %signal, moved_to = %to.display(), kept = good.len(),
                    "persistent queue segment has corrupt records; moved aside, the valid records are kept");
            } else if let Some(at) = sc.torn_at {
                metrics.queue_torn.inc();
                let f = OpenOptions::new().write(true).open(&path).map_err(|e| what(e, "cannot truncate"))?;
                f.set_len(at).map_err(|e| what(e, "cannot truncate a torn record"))?;
                tracing::debug!(exporter = name, signal = %signal, offset = at, "persistent queue: torn last record truncated");
            }
            if let Some((r, _, _)) = good.last() {
                cursor = Some(r.index + 1);
                max_index = Some(r.index);
            }
            let file = match File::open(&path) {
                Ok(f) => Arc::new(f),
                Err(e) => return Err(what(e, "cannot reopen a segment")),
            };
            for (r, off, len) in good {
                if !is_live(r.index) {
                    continue;
                }
                let redelivered = !state_known || r.index < r_old;
                let items = u64::from(r.items);
                let units = units_of(opts.sizer, items, r.payload.len());
                resumed.records += 1;
                resumed.items += items;
                resumed.units += units;
                if redelivered {
                    resumed.redelivered_records += 1;
                    resumed.redelivered_items += items;
                }
                let client = r.client.clone().map(Arc::new);
                pending.push_back(Slot {
                    index: r.index,
                    seg: id,
                    offset: off,
                    len,
                    units,
                    cached: None,
                    cached_bytes: 0,
                    client,
                });
            }
            segments.insert(id, file);
        }
        let next_index =
            max_index.map(|m| m + 1).unwrap_or(0).max(r_old).max(live_old.last().map(|l| l + 1).unwrap_or(0));
        // Appends continue in the last segment, or a new one.
        let (seg, file, len) = match segments.iter().next_back() {
            Some((&id, _)) => {
                let path = dir.join(seg_name(id));
                let f = OpenOptions::new().append(true).open(&path).map_err(|e| what(e, "cannot open for append"))?;
                let len = f.metadata().map_err(|e| what(e, "cannot stat"))?.len();
                (id, f, len)
            }
            None => {
                let path = dir.join(seg_name(next_index));
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| what(e, "cannot create a segment"))?;
                let rf = File::open(&path).map_err(|e| what(e, "cannot open a segment"))?;
                segments.insert(next_index, Arc::new(rf));
                (next_index, f, 0)
            }
        };
        let r = r_old.min(next_index);
        // Resumed records below R (the redelivered ones) stay live below R.
        let live_below: BTreeSet<u64> = pending.iter().map(|s| s.index).filter(|&i| i < r).collect();
        let q = DiskQueue {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            signal,
            opts,
            metrics,
            w: Mutex::new(Writer { file: Arc::new(file), seg, len, next_index, broken: false, written: 0 }),
            synced: Mutex::new(0),
            meta: Mutex::new(Meta { pending, r, live_below, segments, cached_bytes: 0, state_failing: false }),
            _lock: lock,
            #[cfg(test)]
            fail_writes: std::sync::atomic::AtomicBool::new(false),
        };
        {
            let mut m = q.meta.lock();
            q.write_state(&mut m);
            q.delete_done_segments(&mut m);
        }
        Ok((q, resumed))
    }

    /// The queue directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends a record (written to the file, not yet synced); returns its sequence for [`Self::sync`].
    pub(crate) fn append(&self, payload: Payload, client: Option<Arc<ClientInfo>>, units: u64) -> io::Result<u64> {
        let bytes = payload.encode_to_vec();
        let items = payload.item_count() as u32;
        let mut w = self.w.lock();
        if w.broken || w.len >= SEGMENT_MAX {
            self.rotate(&mut w)?;
        }
        let index = w.next_index;
        let frame = record::encode(index, self.signal, items, client.as_deref(), &bytes);
        #[cfg(test)]
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            // A full disk: part of the frame lands, then the write fails.
            let _ = (&*w.file).write_all(&frame[..frame.len() / 2]);
            let e = io::Error::new(io::ErrorKind::StorageFull, "no space left on device (injected)");
            self.roll_back(&mut w);
            return Err(e);
        }
        if let Err(e) = (&*w.file).write_all(&frame) {
            self.roll_back(&mut w);
            return Err(e);
        }
        let offset = w.len;
        w.len += frame.len() as u64;
        w.next_index += 1;
        w.written += 1;
        let seq = w.written;
        let seg = w.seg;
        let mut m = self.meta.lock();
        let (cached, cached_bytes) = if m.cached_bytes + bytes.len() <= READ_AHEAD_BYTES {
            m.cached_bytes += bytes.len();
            (Some(payload), bytes.len())
        } else {
            (None, 0)
        };
        m.pending.push_back(Slot { index, seg, offset, len: frame.len(), units, cached, cached_bytes, client });
        drop(m);
        drop(w);
        Ok(seq)
    }

    /// Removes a partly written frame; failing that, appends go to a new segment.
    fn roll_back(&self, w: &mut Writer) {
        if w.file.set_len(w.len).is_err() {
            w.broken = true;
        }
    }

    fn rotate(&self, w: &mut Writer) -> io::Result<()> {
        if self.opts.fsync {
            w.file.sync_data()?;
        }
        let id = w.next_index;
        let path = self.dir.join(seg_name(id));
        let f = OpenOptions::new().create(true).append(true).open(&path)?;
        let rf = File::open(&path)?;
        if self.opts.fsync {
            sync_dir(&self.dir)?;
        }
        w.file = Arc::new(f);
        w.seg = id;
        w.len = 0;
        w.broken = false;
        self.meta.lock().segments.insert(id, Arc::new(rf));
        Ok(())
    }

    /// Makes every record appended up to `seq` durable (group commit: one sync covers all writers).
    pub(crate) fn sync(&self, seq: u64) -> io::Result<()> {
        let mut synced = self.synced.lock();
        if *synced >= seq {
            return Ok(());
        }
        let (file, upto) = {
            let w = self.w.lock();
            (w.file.clone(), w.written)
        };
        file.sync_data()?;
        *synced = upto;
        Ok(())
    }

    /// Whether appends must be synced before they are acknowledged.
    pub(crate) fn fsync(&self) -> bool {
        self.opts.fsync
    }

    /// Whether a record waits to be sent.
    pub(crate) fn has_pending(&self) -> bool {
        !self.meta.lock().pending.is_empty()
    }

    /// Hands out the next record, if any (a record that cannot be read back is dropped and counted).
    pub(crate) fn pop(&self) -> Option<DiskJob> {
        loop {
            let (slot, file) = {
                let mut m = self.meta.lock();
                let slot = m.pending.pop_front()?;
                m.cached_bytes -= slot.cached_bytes;
                if slot.index >= m.r {
                    m.r = slot.index + 1;
                }
                m.live_below.insert(slot.index);
                let file = m.segments.get(&slot.seg).cloned();
                self.write_state(&mut m);
                (slot, file)
            };
            if let Some(p) = slot.cached {
                return Some(DiskJob { index: slot.index, payload: p, client: slot.client, units: slot.units });
            }
            let read = file.ok_or_else(|| io::Error::other("segment missing")).and_then(|f| {
                let mut buf = vec![0u8; slot.len];
                f.read_exact_at(&mut buf, slot.offset).map(|_| buf)
            });
            let payload = match read {
                Ok(buf) => match record::decode(&buf) {
                    Frame::Ok(r, _) if r.index == slot.index => payload_of(r),
                    _ => None,
                },
                Err(_) => None,
            };
            match payload {
                Some(payload) => {
                    return Some(DiskJob { index: slot.index, payload, client: slot.client, units: slot.units });
                }
                None => {
                    self.metrics.queue_quarantined.inc();
                    tracing::warn!(exporter = %self.name, signal = %self.signal, index = slot.index,
                        "persistent queue record unreadable or corrupt; dropped");
                    self.complete(slot.index);
                }
            }
        }
    }

    /// Marks record `index` done (delivered or dropped for good).
    pub(crate) fn complete(&self, index: u64) {
        let mut m = self.meta.lock();
        m.live_below.remove(&index);
        self.write_state(&mut m);
        self.delete_done_segments(&mut m);
    }

    fn write_state(&self, m: &mut Meta) {
        let tmp = self.dir.join("state.tmp");
        let data = encode_state(m.r, &m.live_below);
        let res = (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(&data)?;
            if self.opts.fsync {
                f.sync_data()?;
            }
            fs::rename(&tmp, self.dir.join("state"))
        })();
        match res {
            Ok(()) => m.state_failing = false,
            Err(e) => {
                if !m.state_failing {
                    tracing::warn!(exporter = %self.name, signal = %self.signal, error = %e,
                        "persistent queue state cannot be written; records done since may be sent again after a restart");
                }
                m.state_failing = true;
            }
        }
    }

    fn delete_done_segments(&self, m: &mut Meta) {
        // The records of a segment are below the next segment's id; the last one takes appends.
        let min_live = m.live_below.first().copied().unwrap_or(m.r).min(m.r);
        let min_live = m.pending.front().map(|s| s.index).unwrap_or(u64::MAX).min(min_live);
        let ids: Vec<u64> = m.segments.keys().copied().collect();
        for pair in ids.windows(2) {
            let (id, next) = (pair[0], pair[1]);
            if next <= min_live {
                m.segments.remove(&id);
                let _ = fs::remove_file(self.dir.join(seg_name(id)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_rejects_damage() {
        let live: BTreeSet<u64> = [3, 9].into();
        let b = encode_state(12, &live);
        assert_eq!(decode_state(&b), Some((12, live)));
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(decode_state(&c).is_none(), "flip at {i}");
        }
        assert!(decode_state(&b[..b.len() - 1]).is_none());
    }

    #[test]
    fn scan_finds_torn_tail_and_corrupt_middle() {
        let f: Vec<Vec<u8>> = (0..3).map(|i| record::encode(i, Signal::Traces, 1, None, b"abc")).collect();
        let all: Vec<u8> = f.concat();
        let s = scan(&all, true, None);
        assert_eq!((s.good.len(), s.corrupt, s.torn_at), (3, false, None));
        let torn = &all[..all.len() - 2];
        let s = scan(torn, true, None);
        assert_eq!((s.good.len(), s.corrupt, s.torn_at), (2, false, Some((f[0].len() + f[1].len()) as u64)));
        let mut mid = all.clone();
        mid[f[0].len() + 14] ^= 0xFF;
        let s = scan(&mid, true, None);
        assert_eq!(s.good.iter().map(|g| g.0.index).collect::<Vec<_>>(), vec![0, 2]);
        assert!(s.corrupt);
        // A torn tail in a closed segment is damage.
        assert!(scan(torn, false, None).corrupt);
    }
}

//! The per-series map every detector keeps: get-or-insert with a touch, least-recently-seen
//! eviction at `max_series`, idle expiry on the watermark, eviction counters, and a sorted,
//! versioned checkpoint form.
//!
//! A detector holds a [`SeriesMap`] of its per-series state `S` (its mathematics) and calls
//! [`SeriesMap::try_touch`] / [`SeriesMap::touch`] per input point, [`SeriesMap::expire_idle`]
//! per watermark, and [`SeriesMap::snapshot`] / [`SeriesMap::restore`] for checkpoints. The
//! rules, the same for every detector:
//!
//! - A new series when `max_series` are held first evicts the least recently seen 10 % of
//!   `max_series` (at least one, and any excess), least recent first; "seen" is the arrival
//!   order of points (the map's sequence), not event time.
//! - A series is idle at watermark `w` when it holds nothing open and its largest event time
//!   `t` has `t + idle_timeout <= w`. The map keeps a lower bound of every series' deadline and
//!   scans only once the watermark reaches it.
//! - A snapshot lists the series sorted by key (equal states give equal bytes) inside an
//!   envelope of the kit's [`FORMAT`] and the detector's state version; restoring refuses
//!   another format or version, bytes that do not decode and duplicate keys, and builds a new
//!   map, so the detector's state is unchanged on error.

use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::ops::RangeBounds;

/// Format of the envelope [`SeriesMap::snapshot`] writes (bumped when the envelope changes).
pub const FORMAT: u32 = 1;

/// Where a map keeps its slots: a [`HashMap`] (the default; O(1) per point) or a [`BTreeMap`]
/// (iteration in key order, for detectors that emit across series in order).
pub trait Store<K, V>: Default {
    /// Iterator over the entries.
    type Iter<'a>: Iterator<Item = (&'a K, &'a V)>
    where
        Self: 'a,
        K: 'a,
        V: 'a;
    /// Iterator over the entries, values mutable.
    type IterMut<'a>: Iterator<Item = (&'a K, &'a mut V)>
    where
        Self: 'a,
        K: 'a,
        V: 'a;
    /// An empty store with room for `n` entries (where the store has a capacity).
    fn with_capacity(n: usize) -> Self;
    /// The value of `k`.
    fn get(&self, k: &K) -> Option<&V>;
    /// The value of `k`, mutable.
    fn get_mut(&mut self, k: &K) -> Option<&mut V>;
    /// Inserts, returning the value replaced.
    fn insert(&mut self, k: K, v: V) -> Option<V>;
    /// Removes `k`, returning its value.
    fn remove(&mut self, k: &K) -> Option<V>;
    /// Number of entries.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The entries.
    fn iter(&self) -> Self::Iter<'_>;
    /// The entries, values mutable.
    fn iter_mut(&mut self) -> Self::IterMut<'_>;
    /// Keeps the entries for which `f` is true.
    fn retain(&mut self, f: impl FnMut(&K, &mut V) -> bool);
    /// Bytes of the slots themselves, estimated (not what the values own on the heap).
    fn slot_bytes(&self) -> usize;
}

impl<K: Hash + Eq, V> Store<K, V> for HashMap<K, V> {
    type Iter<'a>
        = std::collections::hash_map::Iter<'a, K, V>
    where
        K: 'a,
        V: 'a;
    type IterMut<'a>
        = std::collections::hash_map::IterMut<'a, K, V>
    where
        K: 'a,
        V: 'a;
    fn with_capacity(n: usize) -> Self {
        HashMap::with_capacity(n)
    }
    fn get(&self, k: &K) -> Option<&V> {
        HashMap::get(self, k)
    }
    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        HashMap::get_mut(self, k)
    }
    fn insert(&mut self, k: K, v: V) -> Option<V> {
        HashMap::insert(self, k, v)
    }
    fn remove(&mut self, k: &K) -> Option<V> {
        HashMap::remove(self, k)
    }
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn iter(&self) -> Self::Iter<'_> {
        HashMap::iter(self)
    }
    fn iter_mut(&mut self) -> Self::IterMut<'_> {
        HashMap::iter_mut(self)
    }
    fn retain(&mut self, f: impl FnMut(&K, &mut V) -> bool) {
        HashMap::retain(self, f)
    }
    fn slot_bytes(&self) -> usize {
        // One control byte per bucket beside the (key, value) pair.
        self.capacity() * (std::mem::size_of::<(K, V)>() + 1)
    }
}

impl<K: Ord, V> Store<K, V> for BTreeMap<K, V> {
    type Iter<'a>
        = std::collections::btree_map::Iter<'a, K, V>
    where
        K: 'a,
        V: 'a;
    type IterMut<'a>
        = std::collections::btree_map::IterMut<'a, K, V>
    where
        K: 'a,
        V: 'a;
    fn with_capacity(_: usize) -> Self {
        BTreeMap::new()
    }
    fn get(&self, k: &K) -> Option<&V> {
        BTreeMap::get(self, k)
    }
    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        BTreeMap::get_mut(self, k)
    }
    fn insert(&mut self, k: K, v: V) -> Option<V> {
        BTreeMap::insert(self, k, v)
    }
    fn remove(&mut self, k: &K) -> Option<V> {
        BTreeMap::remove(self, k)
    }
    fn len(&self) -> usize {
        BTreeMap::len(self)
    }
    fn iter(&self) -> Self::Iter<'_> {
        BTreeMap::iter(self)
    }
    fn iter_mut(&mut self) -> Self::IterMut<'_> {
        BTreeMap::iter_mut(self)
    }
    fn retain(&mut self, f: impl FnMut(&K, &mut V) -> bool) {
        BTreeMap::retain(self, f)
    }
    fn slot_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<(K, V)>()
    }
}

/// Look-ups of a [`Store`] by a borrowed form `Q` of its key (as `HashMap::get` / `BTreeMap::get`
/// take): a caller holding `&[String]` of a `Vec<String>` key need not allocate one.
pub trait Lookup<Q: ?Sized, V> {
    /// The value of `k`.
    fn find(&self, k: &Q) -> Option<&V>;
    /// The value of `k`, mutable.
    fn find_mut(&mut self, k: &Q) -> Option<&mut V>;
    /// Removes `k`, returning its value.
    fn take(&mut self, k: &Q) -> Option<V>;
}

impl<K: Hash + Eq + Borrow<Q>, Q: Hash + Eq + ?Sized, V> Lookup<Q, V> for HashMap<K, V> {
    fn find(&self, k: &Q) -> Option<&V> {
        HashMap::get(self, k)
    }
    fn find_mut(&mut self, k: &Q) -> Option<&mut V> {
        HashMap::get_mut(self, k)
    }
    fn take(&mut self, k: &Q) -> Option<V> {
        HashMap::remove(self, k)
    }
}

impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> Lookup<Q, V> for BTreeMap<K, V> {
    fn find(&self, k: &Q) -> Option<&V> {
        BTreeMap::get(self, k)
    }
    fn find_mut(&mut self, k: &Q) -> Option<&mut V> {
        BTreeMap::get_mut(self, k)
    }
    fn take(&mut self, k: &Q) -> Option<V> {
        BTreeMap::remove(self, k)
    }
}

/// One series' state and the map's bookkeeping of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot<S> {
    /// The detector's state of the series.
    pub state: S,
    last_time: u64,
    last_seen: u64,
}

impl<S> Slot<S> {
    /// Largest event time of the series' points (ns).
    pub fn last_time(&self) -> u64 {
        self.last_time
    }

    /// Sequence number of the series' latest point (least-recently-seen eviction).
    pub fn last_seen(&self) -> u64 {
        self.last_seen
    }
}

/// Series dropped since the map was built (process counters, not checkpointed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evictions {
    /// Evicted to make room at `max_series`.
    pub max_series: u64,
    /// Forgotten after `idle_timeout`.
    pub idle: u64,
}

/// A series just touched: its state and what making room for it cost.
#[derive(Debug)]
pub struct Touched<'a, S> {
    /// The series' state.
    pub state: &'a mut S,
    /// Series evicted to make room for it (0 unless it is new and the map was full).
    pub evicted: usize,
    /// True when the series was created by this touch.
    pub created: bool,
    /// The series' largest event time before this touch (`None` when created by it).
    pub previous_time: Option<u64>,
}

/// The per-series states of one detector, keyed by `K` (see the module docs for the rules).
#[derive(Debug, Clone)]
pub struct SeriesMap<K, S, M = HashMap<K, Slot<S>>> {
    store: M,
    max_series: usize,
    idle_ns: u64,
    seq: u64,
    /// No series can be idle before this watermark (a lower bound of every deadline).
    next_idle_check: u64,
    evictions: Evictions,
    _marker: std::marker::PhantomData<fn() -> (K, S)>,
}

/// A [`SeriesMap`] iterated in key order.
pub type OrderedSeriesMap<K, S> = SeriesMap<K, S, BTreeMap<K, Slot<S>>>;

impl<K: Ord + Clone, S, M: Store<K, Slot<S>>> SeriesMap<K, S, M> {
    /// An empty map holding at most `max_series` (≥ 1) series, forgetting a series after
    /// `idle_ns` of event time without a point.
    pub fn new(max_series: usize, idle_ns: u64) -> Self {
        SeriesMap {
            store: M::default(),
            max_series: max_series.max(1),
            idle_ns,
            seq: 0,
            next_idle_check: 0,
            evictions: Evictions::default(),
            _marker: std::marker::PhantomData,
        }
    }

    /// Number of series held.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// True when no series is held.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Series dropped since the map was built.
    pub fn evictions(&self) -> Evictions {
        self.evictions
    }

    /// The sequence number of the latest touch (or [`SeriesMap::bump_seq`]).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Advances the sequence and returns it: for a detector that orders its own items (cells,
    /// pooled points) on the map's clock, to [`SeriesMap::mark_seen`] a series with later.
    pub fn bump_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Counts the series `key` as seen at sequence `seq` if that is later than its latest touch.
    pub fn mark_seen<Q: ?Sized>(&mut self, key: &Q, seq: u64)
    where
        M: Lookup<Q, Slot<S>>,
    {
        if let Some(s) = self.store.find_mut(key) {
            s.last_seen = s.last_seen.max(seq);
        }
    }

    /// The state of `key` (not a touch).
    pub fn get<Q: ?Sized>(&self, key: &Q) -> Option<&S>
    where
        M: Lookup<Q, Slot<S>>,
    {
        self.store.find(key).map(|s| &s.state)
    }

    /// The state of `key`, mutable (not a touch).
    pub fn get_mut<Q: ?Sized>(&mut self, key: &Q) -> Option<&mut S>
    where
        M: Lookup<Q, Slot<S>>,
    {
        self.store.find_mut(key).map(|s| &mut s.state)
    }

    /// The slot of `key`: its state and bookkeeping.
    pub fn slot<Q: ?Sized>(&self, key: &Q) -> Option<&Slot<S>>
    where
        M: Lookup<Q, Slot<S>>,
    {
        self.store.find(key)
    }

    /// True when `key` is held.
    pub fn contains_key<Q: ?Sized>(&self, key: &Q) -> bool
    where
        M: Lookup<Q, Slot<S>>,
    {
        self.store.find(key).is_some()
    }

    /// Every series (in key order for an [`OrderedSeriesMap`], else unordered).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &Slot<S>)> {
        self.store.iter()
    }

    /// Every series' state, mutable (in key order for an [`OrderedSeriesMap`], else unordered).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut S)> {
        self.store.iter_mut().map(|(k, s)| (k, &mut s.state))
    }

    /// Removes `key` (not counted as an eviction); returns its state.
    pub fn remove<Q: ?Sized>(&mut self, key: &Q) -> Option<S>
    where
        M: Lookup<Q, Slot<S>>,
    {
        self.store.take(key).map(|s| s.state)
    }

    /// Touches the series `key` with a point at event time `time`; a series not held is made by
    /// `make` (`Ok(None)`: not selected, nothing is created, evicted or counted), after evicting
    /// the least recently seen ones when `max_series` are held, each passed to `on_remove`. The
    /// key may be any borrowed form of `K` (owned only when the series is created).
    pub fn try_touch<Q, E>(
        &mut self,
        key: &Q,
        time: u64,
        make: impl FnOnce() -> Result<Option<S>, E>,
        on_remove: impl FnMut(&K, &S),
    ) -> Result<Option<Touched<'_, S>>, E>
    where
        M: Lookup<Q, Slot<S>>,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        let seq = self.seq + 1;
        self.upsert(key, time, seq, make, on_remove)
    }

    /// [`SeriesMap::try_touch`] for a detector that creates every series it is given.
    pub fn touch<Q>(
        &mut self,
        key: &Q,
        time: u64,
        make: impl FnOnce() -> S,
        on_remove: impl FnMut(&K, &S),
    ) -> Option<Touched<'_, S>>
    where
        M: Lookup<Q, Slot<S>>,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        match self.try_touch::<Q, std::convert::Infallible>(key, time, || Ok(Some(make())), on_remove) {
            Ok(t) => t,
            Err(e) => match e {},
        }
    }

    /// Counts a point of `key` at event time `time` that arrived at an earlier sequence `seq`
    /// (from [`SeriesMap::bump_seq`]), without a new touch: the sequence does not advance, the
    /// series' last event time becomes at least `time` and its last seen at least `seq`. A series
    /// not held is made by `make` (evicting at `max_series` as a touch does) with last event time
    /// `time` and last seen `seq`. For points a detector held back (pooled) before their series
    /// existed: they keep their own arrival order.
    pub fn touch_at<Q>(
        &mut self,
        key: &Q,
        time: u64,
        seq: u64,
        make: impl FnOnce() -> S,
        on_remove: impl FnMut(&K, &S),
    ) -> Option<Touched<'_, S>>
    where
        M: Lookup<Q, Slot<S>>,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        match self.upsert::<Q, std::convert::Infallible>(key, time, seq, || Ok(Some(make())), on_remove) {
            Ok(t) => t,
            Err(e) => match e {},
        }
    }

    /// The series `key` (made by `make` when not held) with last event time raised to `time`
    /// and last seen to `seq`; the map's sequence becomes at least `seq`.
    fn upsert<Q, E>(
        &mut self,
        key: &Q,
        time: u64,
        seq: u64,
        make: impl FnOnce() -> Result<Option<S>, E>,
        on_remove: impl FnMut(&K, &S),
    ) -> Result<Option<Touched<'_, S>>, E>
    where
        M: Lookup<Q, Slot<S>>,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        let mut evicted = 0;
        let previous_time = self.store.find(key).map(|s| s.last_time);
        let created = previous_time.is_none();
        if created {
            let Some(state) = make()? else { return Ok(None) };
            if self.store.len() >= self.max_series {
                evicted = self.evict_least_recent(on_remove);
            }
            self.next_idle_check = self.next_idle_check.min(time.saturating_add(self.idle_ns));
            self.store.insert(key.to_owned(), Slot { state, last_time: time, last_seen: 0 });
        }
        self.seq = self.seq.max(seq);
        let Some(s) = self.store.find_mut(key) else { return Ok(None) };
        s.last_seen = s.last_seen.max(seq);
        s.last_time = s.last_time.max(time);
        Ok(Some(Touched { state: &mut s.state, evicted, created, previous_time }))
    }

    /// Evicts the least recently seen 10 % of `max_series` (at least one, and any excess);
    /// returns how many.
    fn evict_least_recent(&mut self, mut on_remove: impl FnMut(&K, &S)) -> usize {
        let (max, len) = (self.max_series, self.store.len());
        let n = (max / 10).max(1).max((len + 1).saturating_sub(max)).min(len);
        if n == 0 {
            return 0;
        }
        let mut by_age: Vec<(u64, &K)> = self.store.iter().map(|(k, s)| (s.last_seen, k)).collect();
        if n < by_age.len() {
            by_age.select_nth_unstable(n - 1);
        }
        let victims: Vec<K> = by_age[..n].iter().map(|(_, k)| (*k).clone()).collect();
        for k in victims {
            if let Some(s) = self.store.remove(&k) {
                on_remove(&k, &s.state);
            }
        }
        self.evictions.max_series += n as u64;
        n
    }

    /// Forgets the series idle at `watermark`: `open` is `None` for a series that holds nothing
    /// open, else `Some(t)`, a watermark before which what it holds cannot close (0 when not
    /// known); a series holding something open is kept. Each one forgotten is passed to
    /// `on_remove`; returns how many.
    pub fn expire_idle(
        &mut self,
        watermark: u64,
        open: impl Fn(&S) -> Option<u64>,
        mut on_remove: impl FnMut(&K, &S),
    ) -> usize {
        if watermark < self.next_idle_check {
            return 0;
        }
        let idle = self.idle_ns;
        let before = self.store.len();
        let mut next = u64::MAX;
        self.store.retain(|k, s| {
            let deadline = s.last_time.saturating_add(idle);
            match open(&s.state) {
                None if deadline <= watermark => {
                    on_remove(k, &s.state);
                    false
                }
                held => {
                    next = next.min(deadline.max(held.unwrap_or(0)));
                    true
                }
            }
        });
        self.next_idle_check = next;
        let n = before - self.store.len();
        self.evictions.idle += n as u64;
        n
    }

    /// Bytes held, estimated: the slots and what `heap` says each state owns on the heap.
    pub fn approx_bytes(&self, heap: impl Fn(&S) -> usize) -> usize {
        self.store.slot_bytes() + self.store.iter().map(|(_, s)| heap(&s.state)).sum::<usize>()
    }

    /// Serializes the map: the envelope ([`FORMAT`], `version`), the detector's `header`, the
    /// sequence, and every series (key, last event time, last seen, `repr` of its state) sorted
    /// by key, so equal states give equal bytes.
    pub fn snapshot<'s, H, R>(
        &'s self,
        version: u32,
        header: &H,
        repr: impl Fn(&'s K, &'s S) -> R,
    ) -> Result<Vec<u8>, postcard::Error>
    where
        K: Serialize,
        H: Serialize,
        R: Serialize,
    {
        let mut slots: Vec<(&'s K, &'s Slot<S>)> = self.store.iter().collect();
        slots.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let series = slots
            .into_iter()
            .map(|(key, s)| SlotRepr {
                key,
                last_time: s.last_time,
                last_seen: s.last_seen,
                state: repr(key, &s.state),
            })
            .collect();
        postcard::to_allocvec(&Envelope { format: FORMAT, version, header, seq: self.seq, series })
    }

    /// Reads a snapshot of [`SeriesMap::snapshot`] into a new map with this map's limits and
    /// counters, each state rebuilt by `state`; returns the detector's header and the map. This
    /// map is not changed: the caller applies both once it has checked the header.
    pub fn restore<H, R>(
        &self,
        version: u32,
        bytes: &[u8],
        mut state: impl FnMut(&K, R) -> Result<S, RestoreError>,
    ) -> Result<(H, Self), RestoreError>
    where
        K: DeserializeOwned,
        H: DeserializeOwned,
        R: DeserializeOwned,
    {
        let ((format, found), _) = postcard::take_from_bytes::<(u32, u32)>(bytes)?;
        if format != FORMAT {
            return Err(RestoreError::Version { what: "series map format", found: format, expected: FORMAT });
        }
        if found != version {
            return Err(RestoreError::Version { what: "state version", found, expected: version });
        }
        let env: Envelope<H, K, R> = postcard::from_bytes(bytes)?;
        let mut store = M::with_capacity(env.series.len());
        for s in env.series {
            // A slot seen after the map's own sequence would invert the least-recently-seen order.
            if s.last_seen > env.seq {
                return Err(RestoreError::Invalid("a series was seen after the map's sequence"));
            }
            let value = Slot { state: state(&s.key, s.state)?, last_time: s.last_time, last_seen: s.last_seen };
            if store.insert(s.key, value).is_some() {
                return Err(RestoreError::Invalid("duplicate series"));
            }
        }
        let map = SeriesMap {
            store,
            max_series: self.max_series,
            idle_ns: self.idle_ns,
            seq: env.seq,
            next_idle_check: 0,
            evictions: self.evictions,
            _marker: std::marker::PhantomData,
        };
        Ok((env.header, map))
    }
}

impl<K: Ord + Clone, S> OrderedSeriesMap<K, S> {
    /// The series with keys in `range`, in key order (not a touch).
    pub fn range<Q, R>(&self, range: R) -> impl Iterator<Item = (&K, &Slot<S>)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
        R: RangeBounds<Q>,
    {
        self.store.range(range)
    }
}

/// The checkpoint form of a map (written with references, read back owned; same layout).
#[derive(Serialize, Deserialize)]
struct Envelope<H, K, R> {
    format: u32,
    version: u32,
    header: H,
    seq: u64,
    series: Vec<SlotRepr<K, R>>,
}

#[derive(Serialize, Deserialize)]
struct SlotRepr<K, R> {
    key: K,
    last_time: u64,
    last_seen: u64,
    state: R,
}

/// Why a snapshot could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The bytes do not decode.
    #[error("decode: {0}")]
    Decode(#[from] postcard::Error),
    /// Embedded protobuf metadata does not decode.
    #[error("metadata: {0}")]
    Proto(#[from] prost::DecodeError),
    /// Written in another envelope format or state version.
    #[error("{what} {found}, this build reads {expected}")]
    Version {
        /// `series map format` or `state version`.
        what: &'static str,
        /// Value in the snapshot.
        found: u32,
        /// Value this build writes.
        expected: u32,
    },
    /// Written with other parameters than the configured ones.
    #[error("written with {what} {found} ns, configured {expected} ns")]
    Params {
        /// The parameter (`window`, `flush_interval`, ...).
        what: &'static str,
        /// Value in the snapshot.
        found: u64,
        /// Configured value.
        expected: u64,
    },
    /// A part of a series' state violates its invariants.
    #[error("{what}: {message}")]
    Part {
        /// The part (`window`, `sketch`, ...).
        what: &'static str,
        /// Why.
        message: String,
    },
    /// The state violates an invariant.
    #[error("invalid state: {0}")]
    Invalid(&'static str),
}

impl RestoreError {
    /// A part of a series' state (`what`) refused for `e`.
    pub fn part(what: &'static str, e: impl std::fmt::Display) -> Self {
        RestoreError::Part { what, message: e.to_string() }
    }
}

/// What a series' derived points carry over from its source points.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeriesMeta {
    /// Source metric name.
    pub metric: String,
    /// Source metric unit.
    pub unit: String,
    /// Source resource.
    pub resource: Resource,
    /// Source ResourceMetrics schema_url.
    pub resource_schema_url: String,
    /// Source instrumentation scope.
    pub scope: InstrumentationScope,
    /// Source ScopeMetrics schema_url.
    pub scope_schema_url: String,
    /// Source point attributes.
    pub attributes: Vec<KeyValue>,
}

impl SeriesMeta {
    /// Heap bytes, estimated (strings and vectors, not allocator overhead).
    pub fn heap_bytes(&self) -> usize {
        fn kvs(v: &[KeyValue]) -> usize {
            v.iter().map(|kv| std::mem::size_of::<KeyValue>() + kv.key.len() + kv.encoded_len()).sum()
        }
        self.metric.len()
            + self.unit.len()
            + self.resource_schema_url.len()
            + self.scope_schema_url.len()
            + kvs(&self.resource.attributes)
            + self.scope.name.len()
            + self.scope.version.len()
            + kvs(&self.scope.attributes)
            + kvs(&self.attributes)
    }
}

/// [`SeriesMeta`] in checkpoints: the OTLP parts protobuf-encoded (their serde form is
/// JSON-specific).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaRepr {
    metric: String,
    unit: String,
    resource: Vec<u8>,
    resource_schema_url: String,
    scope: Vec<u8>,
    scope_schema_url: String,
    attributes: Vec<Vec<u8>>,
}

impl From<&SeriesMeta> for MetaRepr {
    fn from(m: &SeriesMeta) -> Self {
        MetaRepr {
            metric: m.metric.clone(),
            unit: m.unit.clone(),
            resource: m.resource.encode_to_vec(),
            resource_schema_url: m.resource_schema_url.clone(),
            scope: m.scope.encode_to_vec(),
            scope_schema_url: m.scope_schema_url.clone(),
            attributes: m.attributes.iter().map(|kv| kv.encode_to_vec()).collect(),
        }
    }
}

impl TryFrom<MetaRepr> for SeriesMeta {
    type Error = prost::DecodeError;

    fn try_from(r: MetaRepr) -> Result<Self, prost::DecodeError> {
        Ok(SeriesMeta {
            metric: r.metric,
            unit: r.unit,
            resource: Resource::decode(r.resource.as_slice())?,
            resource_schema_url: r.resource_schema_url,
            scope: InstrumentationScope::decode(r.scope.as_slice())?,
            scope_schema_url: r.scope_schema_url,
            attributes: r.attributes.iter().map(|b| KeyValue::decode(b.as_slice())).collect::<Result<_, _>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::kv_str;

    type Map = SeriesMap<u64, u32>;

    fn fill(m: &mut Map, ids: impl IntoIterator<Item = u64>, time: u64) {
        for id in ids {
            m.touch(&id, time, || 0, |_, _| panic!("no eviction expected"));
        }
    }

    fn keys<M: Store<u64, Slot<u32>>>(m: &SeriesMap<u64, u32, M>) -> Vec<u64> {
        let mut v: Vec<u64> = m.iter().map(|(k, _)| *k).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn evicts_the_least_recently_seen_tenth_to_the_hook() {
        let mut m = Map::new(20, 100);
        fill(&mut m, 0..20, 10);
        // 0 and 1 seen again: 2 and 3 are now the least recent.
        m.touch(&0, 10, || 0, |_, _| {});
        m.touch(&1, 5, || 0, |_, _| {});
        let mut removed = Vec::new();
        let t = m.touch(&100, 10, || 7, |k, _| removed.push(*k)).unwrap();
        assert_eq!((*t.state, t.evicted, t.created), (7, 2, true));
        removed.sort_unstable();
        assert_eq!(removed, vec![2, 3]);
        assert_eq!(m.len(), 19);
        assert!(m.contains_key(&0) && m.contains_key(&1) && !m.contains_key(&2));
        assert_eq!(m.evictions(), Evictions { max_series: 2, idle: 0 });
        // A touch of a held series evicts nothing, even when full.
        fill(&mut m, [200], 10);
        let t = m.touch(&200, 10, || 9, |_, _| panic!("held")).unwrap();
        assert_eq!((*t.state, t.evicted, t.created), (0, 0, false));
    }

    #[test]
    fn small_maps_evict_at_least_one_and_any_excess() {
        let mut m = Map::new(3, 100);
        fill(&mut m, 0..3, 0);
        assert_eq!(m.touch(&9, 0, || 0, |_, _| {}).unwrap().evicted, 1);
        assert_eq!(keys(&m), vec![1, 2, 9]);
        // A map restored above its limit (a smaller max_series configured) sheds the excess.
        let bytes = m.snapshot(1, &(), |_, s| *s).unwrap();
        let small = Map::new(2, 100);
        let ((), mut small) = small.restore(1, &bytes, |_, s: u32| Ok(s)).unwrap();
        assert_eq!(small.touch(&10, 0, || 0, |_, _| {}).unwrap().evicted, 2);
        assert_eq!(keys(&small), vec![9, 10]);
    }

    #[test]
    fn a_filtered_series_is_neither_created_nor_counted() {
        let mut m = Map::new(1, 100);
        fill(&mut m, [1], 0);
        let r = m.try_touch(&2, 0, || Ok::<_, ()>(None), |_, _| panic!("nothing evicted for a filtered series"));
        assert!(matches!(r, Ok(None)));
        assert_eq!((m.len(), m.seq()), (1, 1));
        assert!(m.try_touch(&2, 0, || Err("bad"), |_, _| {}).is_err());
        assert_eq!(keys(&m), vec![1]);
    }

    #[test]
    fn idle_series_expire_on_the_watermark_and_open_ones_stay() {
        let mut m = Map::new(100, 100);
        fill(&mut m, 0..4, 10);
        fill(&mut m, [5], 60);
        // Series 3 holds a window open until 200.
        let open = |s: &u32| (*s == 3).then_some(200);
        *m.get_mut(&3).unwrap() = 3;
        let mut removed = Vec::new();
        assert_eq!(m.expire_idle(109, open, |k, _| removed.push(*k)), 0);
        assert_eq!(m.expire_idle(110, open, |k, _| removed.push(*k)), 3);
        removed.sort_unstable();
        assert_eq!(removed, vec![0, 1, 2]);
        assert_eq!(keys(&m), vec![3, 5]);
        assert_eq!(m.expire_idle(160, open, |_, _| {}), 1, "series 5 idle at 60 + 100");
        // Its window closed: series 3 now expires at the next check.
        *m.get_mut(&3).unwrap() = 0;
        assert_eq!(m.expire_idle(199, open, |_, _| {}), 0, "no check before the open window's end");
        assert_eq!(m.expire_idle(200, open, |_, _| {}), 1);
        assert_eq!(m.evictions(), Evictions { max_series: 0, idle: 5 });
    }

    #[test]
    fn the_next_check_skips_scans_but_new_series_lower_it() {
        let mut m = Map::new(100, 100);
        fill(&mut m, [1], 1000);
        let scans = std::cell::Cell::new(0);
        let open = |_: &u32| {
            scans.set(scans.get() + 1);
            None
        };
        assert_eq!(m.expire_idle(0, open, |_, _| {}), 0);
        assert_eq!(scans.get(), 1, "the first check scans");
        assert_eq!(m.expire_idle(500, open, |_, _| {}), 0);
        assert_eq!(scans.get(), 1, "no series can be idle before 1100: no scan");
        // A new series with an earlier time lowers the bound.
        fill(&mut m, [2], 10);
        assert_eq!(m.expire_idle(500, open, |_, _| {}), 1);
        assert_eq!(keys(&m), vec![1]);
        // A later point of a held series raises its deadline.
        m.touch(&1, 2000, || 0, |_, _| {});
        assert_eq!(m.expire_idle(1100, open, |_, _| {}), 0);
        assert_eq!(keys(&m), vec![1]);
        assert_eq!(m.expire_idle(2100, open, |_, _| {}), 1);
    }

    #[test]
    fn snapshots_are_sorted_and_round_trip() {
        let mut a = Map::new(10, 100);
        let mut b = Map::new(10, 100);
        for id in [5, 1, 9, 3] {
            a.touch(&id, id * 10, || id as u32, |_, _| {});
        }
        for id in [9, 3, 1, 5] {
            b.touch(&id, id * 10, || id as u32, |_, _| {});
        }
        // Same series, same seq, other insertion order: touch again to equalise last_seen.
        for id in [5, 1, 9, 3] {
            a.touch(&id, 0, || 0, |_, _| {});
            b.touch(&id, 0, || 0, |_, _| {});
        }
        let (sa, sb) = (a.snapshot(3, &42u8, |_, s| *s).unwrap(), b.snapshot(3, &42u8, |_, s| *s).unwrap());
        assert_eq!(sa, sb, "equal states give equal bytes");
        let (h, r): (u8, Map) = Map::new(10, 100).restore(3, &sa, |k, s: u32| Ok(s + *k as u32)).unwrap();
        assert_eq!(h, 42);
        assert_eq!((r.seq(), r.len(), r.get(&9).copied()), (8, 4, Some(18)));
        assert_eq!(r.slot(&3).map(|s| (s.last_time(), s.last_seen())), Some((30, 8)));
        // The restored map keeps the bookkeeping: 5 is the least recently seen.
        let (_, mut r): (u8, Map) = Map::new(4, 100).restore(3, &sa, |_, s: u32| Ok(s)).unwrap();
        assert_eq!(r.touch(&7, 0, || 0, |_, _| {}).unwrap().evicted, 1);
        assert!(!r.contains_key(&5));
    }

    #[test]
    fn an_ordered_map_iterates_in_key_order() {
        let mut m: OrderedSeriesMap<String, u32> = OrderedSeriesMap::new(10, 100);
        for k in ["c", "a", "b"] {
            m.touch(&k.to_string(), 0, || 0, |_, _| {});
        }
        let order: Vec<&str> = m.iter_mut().map(|(k, _)| k.as_str()).collect();
        assert_eq!(order, vec!["a", "b", "c"]);
        assert!(m.approx_bytes(|_| 0) >= 3 * std::mem::size_of::<(String, Slot<u32>)>());
    }

    #[test]
    fn restore_refuses_corrupt_bytes_duplicates_and_versions() {
        let mut m = Map::new(10, 100);
        fill(&mut m, [1, 2], 0);
        let bytes = m.snapshot(2, &(), |_, s| *s).unwrap();
        let restore = |b: &[u8], v: u32| m.restore::<(), u32>(v, b, |_, s| Ok(s)).map(|(_, r)| r.len());
        assert_eq!(restore(&bytes, 2).unwrap(), 2);
        assert!(matches!(restore(&bytes[..bytes.len() - 1], 2), Err(RestoreError::Decode(_))));
        assert!(matches!(restore(b"", 2), Err(RestoreError::Decode(_))));
        let e = restore(&bytes, 3).unwrap_err();
        assert!(matches!(e, RestoreError::Version { what: "state version", found: 2, expected: 3 }), "{e}");
        assert_eq!(e.to_string(), "state version 2, this build reads 3");
        let other_format = postcard::to_allocvec(&(FORMAT + 1, 2u32)).unwrap();
        assert!(matches!(restore(&other_format, 2), Err(RestoreError::Version { what: "series map format", .. })));
        // Two slots of key 1.
        let dup = postcard::to_allocvec(&Envelope {
            format: FORMAT,
            version: 2,
            header: (),
            seq: 2,
            series: vec![
                SlotRepr { key: 1u64, last_time: 0, last_seen: 1, state: 0u32 },
                SlotRepr { key: 1u64, last_time: 0, last_seen: 2, state: 0u32 },
            ],
        })
        .unwrap();
        assert!(matches!(restore(&dup, 2), Err(RestoreError::Invalid("duplicate series"))));
        // A slot seen after the map's sequence.
        let ahead = postcard::to_allocvec(&Envelope {
            format: FORMAT,
            version: 2,
            header: (),
            seq: 2,
            series: vec![SlotRepr { key: 1u64, last_time: 0, last_seen: 3, state: 0u32 }],
        })
        .unwrap();
        assert!(matches!(restore(&ahead, 2), Err(RestoreError::Invalid("a series was seen after the map's sequence"))));
        // A state refused by the detector refuses the snapshot.
        let e = m.restore::<(), u32>(2, &bytes, |_, _| Err(RestoreError::part("window", "too long"))).unwrap_err();
        assert_eq!(e.to_string(), "window: too long");
        assert_eq!(keys(&m), vec![1, 2], "the map restored from is unchanged");
    }

    #[test]
    fn touch_at_keeps_the_sequence_and_counts_a_pooled_point_at_its_own() {
        let mut m = Map::new(3, 100);
        fill(&mut m, 1..=3, 10);
        // A point pooled at sequence 4, then 1 touched at 5.
        let pooled = m.bump_seq();
        m.touch(&1, 10, || 0, |_, _| {});
        assert_eq!(m.seq(), 5);
        let t = m.touch_at(&2, 50, pooled, || 9, |_, _| panic!("held")).unwrap();
        assert_eq!((*t.state, t.evicted, t.created, t.previous_time), (0, 0, false, Some(10)));
        assert_eq!(m.seq(), 5, "no new touch");
        assert_eq!(m.slot(&2).map(|s| (s.last_time(), s.last_seen())), Some((50, 4)));
        // An earlier time or sequence lowers neither.
        m.touch_at(&2, 5, 1, || 0, |_, _| {});
        assert_eq!(m.slot(&2).map(|s| (s.last_time(), s.last_seen())), Some((50, 4)));
        // Created at an earlier sequence (full: evicts 3, seen at 3, the least recent).
        let mut removed = Vec::new();
        let t = m.touch_at(&7, 20, 2, || 7, |k, _| removed.push(*k)).unwrap();
        assert_eq!((*t.state, t.evicted, t.created, t.previous_time), (7, 1, true, None));
        assert_eq!((removed, m.seq()), (vec![3], 5));
        assert_eq!(m.slot(&7).map(|s| (s.last_time(), s.last_seen())), Some((20, 2)));
        // 7, seen at 2, is now the least recent: the next new series evicts it, not 2 (4).
        assert_eq!(m.touch(&8, 0, || 0, |_, _| {}).unwrap().evicted, 1);
        assert_eq!(keys(&m), vec![1, 2, 8]);
        assert_eq!(m.seq(), 6);
    }

    #[test]
    fn touch_at_creation_lowers_the_next_idle_check() {
        let mut m = Map::new(10, 100);
        fill(&mut m, [1], 1000);
        assert_eq!(m.expire_idle(0, |_| None, |_, _| {}), 0);
        // Created by a pooled point of time 10: idle at 110, before series 1 (1100).
        let seq = m.bump_seq();
        m.touch_at(&2, 10, seq, || 0, |_, _| {});
        assert_eq!(m.expire_idle(109, |_| None, |_, _| {}), 0);
        assert_eq!(m.expire_idle(110, |_| None, |_, _| {}), 1);
        assert_eq!(keys(&m), vec![1]);
        // A raised time raises the deadline.
        m.touch_at(&1, 2000, seq, || 0, |_, _| {});
        assert_eq!(m.expire_idle(1100, |_| None, |_, _| {}), 0);
        assert_eq!(m.expire_idle(2100, |_| None, |_, _| {}), 1);
    }

    #[test]
    fn touched_carries_the_previous_time() {
        let mut m = Map::new(10, 100);
        assert_eq!(m.touch(&1, 50, || 0, |_, _| {}).unwrap().previous_time, None);
        assert_eq!(m.touch(&1, 30, || 0, |_, _| {}).unwrap().previous_time, Some(50));
        assert_eq!(m.touch(&1, 80, || 0, |_, _| {}).unwrap().previous_time, Some(50), "30 was earlier");
        assert_eq!(m.touch(&1, 90, || 0, |_, _| {}).unwrap().previous_time, Some(80));
    }

    #[test]
    fn ordered_maps_answer_ranges_and_look_ups_take_borrowed_keys() {
        let mut m: OrderedSeriesMap<Vec<String>, u32> = OrderedSeriesMap::new(10, 100);
        let key = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        for (i, k) in [["b", "1"], ["a", "2"], ["b", "0"], ["c", "0"]].iter().enumerate() {
            // A borrowed key: owned only when the series is created.
            m.touch(key(k).as_slice(), 0, || i as u32, |_, _| {});
        }
        let b: Vec<&Vec<String>> = m.range(key(&["b"])..key(&["c"])).map(|(k, _)| k).collect();
        assert_eq!(b, vec![&key(&["b", "0"]), &key(&["b", "1"])]);
        assert_eq!(m.range(key(&["c"])..).count(), 1);
        let k = key(&["a", "2"]);
        assert_eq!(m.get(k.as_slice()), Some(&1));
        assert!(m.contains_key(k.as_slice()) && m.slot(k.as_slice()).is_some());
        *m.get_mut(k.as_slice()).unwrap() = 5;
        m.mark_seen(k.as_slice(), 99);
        assert_eq!(m.slot(k.as_slice()).map(Slot::last_seen), Some(99));
        assert_eq!(m.remove(k.as_slice()), Some(5));
        assert!(!m.contains_key(k.as_slice()));
        // A hash map too.
        let mut h: SeriesMap<String, u32> = SeriesMap::new(10, 100);
        h.touch("x", 0, || 3, |_, _| {});
        assert_eq!((h.get("x"), h.contains_key("y")), (Some(&3), false));
    }

    #[test]
    fn series_meta_round_trips_through_its_repr() {
        let meta = SeriesMeta {
            metric: "m".into(),
            unit: "s".into(),
            resource: Resource { attributes: vec![kv_str("service.name", "vllm")], ..Default::default() },
            resource_schema_url: "r".into(),
            scope: InstrumentationScope { name: "sc".into(), ..Default::default() },
            scope_schema_url: "u".into(),
            attributes: vec![kv_str("model", "x")],
        };
        let repr = MetaRepr::from(&meta);
        let back =
            SeriesMeta::try_from(postcard::from_bytes::<MetaRepr>(&postcard::to_allocvec(&repr).unwrap()).unwrap());
        assert_eq!(back.unwrap(), meta);
        let bad = MetaRepr { resource: vec![0xff], ..repr };
        assert!(SeriesMeta::try_from(bad).is_err());
        assert!(meta.heap_bytes() > 0);
    }
}

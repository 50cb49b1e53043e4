//! The state of `delta_ab`: per group, the open tumbling windows with the values of each version,
//! the ring of closed windows still inside the look-back, the version table (with automatic
//! pairing: each version's first and last point, the pair compared, the pairs that ended),
//! held in the kit's [`SeriesMap`] (eviction, idle expiry, the checkpoint envelope).

use super::STATE_VERSION;
use super::stats::{FNV_OFFSET, XorShift, fnv1a, splitmix64, window_seed};
use crate::detect::series::SeriesMap;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use crate::detect::series::RestoreError;

/// Parameters of the state (from the configuration; not checkpointed but `window_ns`).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Window length in ns (> 0).
    pub window_ns: u64,
    /// Idle timeout in ns of event time.
    pub idle_ns: u64,
    /// Most groups held.
    pub max_series: usize,
    /// Most values kept per version and window (beyond: reservoir sampling).
    pub max_samples: usize,
    /// Look-back in ns: a positive multiple of `window_ns` (`window_ns`: each window on its own).
    pub lookback_ns: u64,
    /// Most kept values per version over the look-back (≥ `max_samples`); beyond, the oldest
    /// windows leave the look-back.
    pub max_points: usize,
    /// Warm-up in ns: a replica's points of a version within this span after its first point
    /// of that version are left out (counted in [`Side::warmup`]); 0: none.
    pub warmup_ns: u64,
}

/// Most distinct replicas counted per version and window, and first points remembered per group
/// for the warm-up (beyond: not counted, not warmed up).
pub const MAX_REPLICAS: usize = 4096;

/// How the two versions compared in a group are chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Pairing {
    /// A fixed baseline and candidate (the caller passes only their points).
    Explicit {
        /// Version A.
        baseline: String,
        /// Version B.
        candidate: String,
    },
    /// From the versions live at each window end: the newest against the most-seen older one.
    Auto {
        /// A version is live at a window end `e` when its last point is at or after `e − live_ns`.
        live_ns: u64,
        /// Most versions held per group (≥ 2).
        max_versions: usize,
    },
}

/// The values of one version in one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// Values kept (all of them up to `max_samples`, then a uniform reservoir).
    pub values: Vec<f64>,
    /// Request-id hash of each value (0: none), parallel to `values`.
    pub ids: Vec<u64>,
    /// Points seen (the sample size reported).
    pub seen: u64,
    /// Reservoir generator state.
    rng: u64,
    /// Hashes of the distinct replicas (instance attribute) with a point here, sorted (at most
    /// [`MAX_REPLICAS`]; points without the attribute add none).
    pub replicas: Vec<u64>,
    /// Points left out as a replica's warm-up (not in `seen`).
    pub warmup: u64,
}

impl Side {
    fn new(seed: u64) -> Self {
        Side {
            values: Vec::new(),
            ids: Vec::new(),
            seen: 0,
            rng: XorShift::new(seed).state(),
            replicas: Vec::new(),
            warmup: 0,
        }
    }

    /// Records replica `replica` (0: none) as having a point here.
    fn note_replica(&mut self, replica: u64) {
        if replica == 0 || self.replicas.len() >= MAX_REPLICAS {
            return;
        }
        if let Err(i) = self.replicas.binary_search(&replica) {
            self.replicas.insert(i, replica);
        }
    }

    fn add(&mut self, value: f64, id: u64, cap: usize) {
        self.seen += 1;
        if self.values.len() < cap {
            self.values.push(value);
            self.ids.push(id);
            return;
        }
        // Algorithm R: the i-th point replaces a kept one with probability cap / i.
        let mut rng = XorShift::from_state(self.rng);
        let j = rng.below(self.seen) as usize;
        self.rng = rng.state();
        if j < self.values.len() && j < self.ids.len() {
            self.values[j] = value;
            self.ids[j] = id;
        }
    }
}

/// The values of one named version in one window, with the event times of its first and last
/// point there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionSide {
    /// The version.
    pub version: String,
    /// Event time of its first point in the window.
    pub first: u64,
    /// Event time of its last point in the window.
    pub last: u64,
    /// Its values.
    pub side: Side,
}

/// One tumbling window of one group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Inclusive start, ns since the epoch.
    pub start: u64,
    /// Exclusive end, ns since the epoch.
    pub end: u64,
    /// The versions with a point in the window, in the order of their first point.
    pub sides: Vec<VersionSide>,
}

impl Window {
    /// The values of `version` in this window, if it had a point.
    pub fn side(&self, version: &str) -> Option<&Side> {
        self.sides.iter().find(|s| s.version == version).map(|s| &s.side)
    }
}

/// Where output points come from: the resource and scope of a version's first point.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Meta {
    /// Resource of the output.
    pub resource: Resource,
    /// Scope of the output.
    pub scope: InstrumentationScope,
}

/// One version of a group's version table.
#[derive(Debug, Clone, PartialEq)]
struct Version {
    /// Resource and scope of its first point (since it entered the table).
    meta: Meta,
    /// Event times of its first and last point in a closed window (none until one closes).
    seen: Option<(u64, u64)>,
    /// Arrival sequence number of its latest point (eviction order at `max_versions`).
    touched: u64,
}

/// A pair that was compared and is no longer: level-0 points name it for `live_ns` after it ended.
#[derive(Debug, Clone, PartialEq)]
struct Ended {
    baseline: String,
    candidate: String,
    /// The candidate's resource and scope (the alert identity of the pair's points).
    meta: Meta,
    /// Window end at which it ended.
    since: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Group {
    versions: BTreeMap<String, Version>,
    /// Open windows.
    windows: Vec<Window>,
    /// Closed windows that may still enter a later look-back, oldest first.
    ring: VecDeque<Window>,
    /// The (baseline, candidate) compared at the latest evaluation (automatic pairing).
    pair: Option<(String, String)>,
    /// Pairs that ended, oldest first (automatic pairing).
    ended: Vec<Ended>,
    /// (version, replica hash) → event time of that replica's first point of that version (for
    /// the warm-up; at most [`MAX_REPLICAS`]).
    first_points: BTreeMap<(String, u64), u64>,
}

/// What one evaluation compares: the closed window and the earlier windows of the look-back.
#[derive(Debug, Clone, Copy)]
pub struct Lookback<'a> {
    /// Earlier closed windows inside the look-back, oldest first (empty when the look-back is
    /// one window).
    pub earlier: &'a [Window],
    /// The window just closed (its start seeds the bootstrap; its end is the output time).
    pub current: &'a Window,
}

impl<'a> Lookback<'a> {
    /// Every window of the look-back, oldest first, ending with the current one.
    pub fn windows(&self) -> impl Iterator<Item = &'a Window> + 'a {
        self.earlier.iter().chain(std::iter::once(self.current))
    }

    /// Start of the oldest window used (the look-back actually spans `current.end − start`).
    pub fn start(&self) -> u64 {
        self.earlier.first().map_or(self.current.start, |w| w.start)
    }

    /// Points of `version` in the look-back.
    pub fn seen(&self, version: &str) -> u64 {
        self.windows().filter_map(|w| w.side(version)).fold(0u64, |n, s| n.saturating_add(s.seen))
    }

    /// Distinct replicas of `version` with a point in the windows `use_window` accepts.
    pub fn replicas(&self, version: &str, use_window: impl Fn(&Window) -> bool) -> usize {
        let mut all: BTreeSet<u64> = BTreeSet::new();
        for s in self.windows().filter(|w| use_window(w)).filter_map(|w| w.side(version)) {
            all.extend(s.replicas.iter().copied());
        }
        all.len()
    }

    /// Points of `version` left out as warm-up in the look-back.
    pub fn warmup(&self, version: &str) -> u64 {
        self.windows().filter_map(|w| w.side(version)).fold(0u64, |n, s| n.saturating_add(s.warmup))
    }
}

/// One output of a window's end for a group.
#[derive(Debug, Clone, Copy)]
pub enum Eval<'a> {
    /// Compare `candidate` against `baseline` over the look-back.
    Compare {
        /// Version A.
        baseline: &'a str,
        /// Version B.
        candidate: &'a str,
        /// Resource and scope of the output (the candidate's; the baseline's until it has a point).
        meta: &'a Meta,
        /// Versions live at the window end (automatic pairing only).
        live: Option<usize>,
        /// The windows judged.
        lookback: Lookback<'a>,
    },
    /// A pair compared earlier is no longer (one of its versions stopped being live, or a newer
    /// candidate arrived): a level-0 point at `end` under its candidate's identity.
    Ended {
        /// Version A of the ended pair.
        baseline: &'a str,
        /// Version B of the ended pair.
        candidate: &'a str,
        /// The candidate's resource and scope.
        meta: &'a Meta,
        /// Versions live at the window end.
        live: usize,
        /// The window end (output time).
        end: u64,
    },
}

/// How many of `ring`'s windows (counted from its newest end) join `current` in the look-back:
/// those starting at or after `current.end − lookback_ns`, newest first, as long as the kept
/// values of every version stay within `max_points`.
fn lookback_len(ring: &VecDeque<Window>, current: &Window, params: &Params) -> usize {
    let from = current.end.saturating_sub(params.lookback_ns);
    let mut kept: Vec<(&str, usize)> =
        current.sides.iter().map(|s| (s.version.as_str(), s.side.values.len())).collect();
    let mut n = 0;
    for w in ring.iter().rev() {
        if w.start < from {
            break;
        }
        let mut over = false;
        for s in &w.sides {
            let i = match kept.iter().position(|k| k.0 == s.version) {
                Some(i) => i,
                None => {
                    kept.push((s.version.as_str(), 0));
                    kept.len() - 1
                }
            };
            if let Some(k) = kept.get_mut(i) {
                k.1 += s.side.values.len();
                over |= k.1 > params.max_points;
            }
        }
        if over {
            break;
        }
        n += 1;
    }
    n
}

/// Why a point was not added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its event time is before the watermark (its window is closed).
    Late,
}

/// What adding a point evicted to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Evicted {
    /// Groups evicted at `max_series`.
    pub groups: usize,
    /// Versions of the point's group evicted at `max_versions`.
    pub versions: usize,
}

/// Version names in natural order: runs of digits compare as numbers (`v9` < `v10`), the rest
/// byte-wise; equal runs fall back to the plain order.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn runs(s: &str) -> impl Iterator<Item = (bool, &str)> {
        let mut rest = s;
        std::iter::from_fn(move || {
            let first = rest.chars().next()?;
            let digit = first.is_ascii_digit();
            let n = rest.find(|c: char| c.is_ascii_digit() != digit).unwrap_or(rest.len());
            let (run, tail) = rest.split_at(n);
            rest = tail;
            Some((digit, run))
        })
    }
    let mut ra = runs(a);
    let mut rb = runs(b);
    loop {
        match (ra.next(), rb.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((da, x)), Some((db, y))) => {
                let o = if da && db {
                    let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                    x.len().cmp(&y.len()).then_with(|| x.cmp(y))
                } else {
                    x.cmp(y)
                };
                if o != Ordering::Equal {
                    return o;
                }
            }
        }
    }
}

/// The newest live version against the live version with the most points in the look-back among
/// the others (ties: the older). Age is the window of a version's first point, then the natural
/// order of the names (`v1` older than `v2`, `v9` than `v10`), so that versions starting in the
/// same window (mirrored traffic) pair by name. `live`: (name, start of its first window).
fn choose(live: &[(&str, u64)], l: &Lookback<'_>) -> Option<(String, String)> {
    if live.len() < 2 {
        return None;
    }
    let age = |a: &(&str, u64), b: &(&str, u64)| a.1.cmp(&b.1).then_with(|| natural_cmp(a.0, b.0));
    let candidate = live.iter().max_by(|a, b| age(a, b))?;
    let baseline = live
        .iter()
        .filter(|v| v.0 != candidate.0)
        .max_by(|a, b| l.seen(a.0).cmp(&l.seen(b.0)).then_with(|| age(b, a)))?;
    Some((baseline.0.to_string(), candidate.0.to_string()))
}

/// Removes `version`'s values from `windows`.
fn strip<'w>(windows: impl Iterator<Item = &'w mut Window>, version: &str) {
    for w in windows {
        w.sides.retain(|s| s.version != version);
    }
}

impl Group {
    fn new() -> Self {
        Group {
            versions: BTreeMap::new(),
            windows: Vec::new(),
            ring: VecDeque::new(),
            pair: None,
            ended: Vec::new(),
            first_points: BTreeMap::new(),
        }
    }

    /// Evicts the least recently seen version (one outside the compared pair when there is one)
    /// with its values; a pair it belonged to ends at `now`.
    fn evict_version(&mut self, now: u64) -> usize {
        let in_pair = |name: &str| self.pair.as_ref().is_some_and(|(a, b)| a == name || b == name);
        let victim = self
            .versions
            .iter()
            .filter(|(n, _)| !in_pair(n))
            .min_by_key(|(_, v)| v.touched)
            .or_else(|| self.versions.iter().min_by_key(|(_, v)| v.touched))
            .map(|(n, _)| n.clone());
        let Some(victim) = victim else { return 0 };
        if let Some((b, c)) = self.pair.take_if(|(a, b)| *a == victim || *b == victim)
            && let Some(v) = self.versions.get(&c)
        {
            let meta = v.meta.clone();
            self.ended.retain(|e| e.candidate != c);
            self.ended.push(Ended { baseline: b, candidate: c, meta, since: now });
        }
        self.versions.remove(&victim);
        self.first_points.retain(|(v, _), _| *v != victim);
        strip(self.windows.iter_mut().chain(self.ring.iter_mut()), &victim);
        tracing::debug!(version = %victim, "delta_ab: evicted a version at max_versions");
        1
    }
}

/// Open windows of every group, indexed by window end for closing in order.
pub struct State {
    params: Params,
    pairing: Pairing,
    series: SeriesMap<Vec<String>, Group>,
    open: BTreeSet<(u64, Vec<String>)>,
    watermark: u64,
}

impl State {
    /// An empty state.
    pub fn new(params: Params, pairing: Pairing) -> Self {
        State {
            params,
            pairing,
            series: SeriesMap::new(params.max_series, params.idle_ns),
            open: BTreeSet::new(),
            watermark: 0,
        }
    }

    /// Number of groups held.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Seed of the reservoir of `version` in a window whose seed is `seed`.
    fn side_seed(&self, seed: u64, version: &str) -> u64 {
        match &self.pairing {
            Pairing::Explicit { baseline, .. } if version == baseline => seed ^ 0xA,
            Pairing::Explicit { .. } => splitmix64(seed ^ 0xB),
            Pairing::Auto { .. } => splitmix64(seed ^ fnv1a(FNV_OFFSET, version.as_bytes())),
        }
    }

    /// Adds a point of `version` in group `key` from no named replica: [`State::add_from`] with
    /// replica 0.
    pub fn add<E>(
        &mut self,
        key: Vec<String>,
        time: u64,
        value: f64,
        version: &str,
        id: u64,
        meta: impl FnOnce() -> Result<(Resource, InstrumentationScope), E>,
    ) -> Result<Result<Evicted, Skip>, E> {
        self.add_from(key, time, value, version, id, 0, meta)
    }

    /// Adds a point of `version` in group `key` from replica `replica` (a hash of the instance
    /// attribute; 0: none). `meta` is called when the version is new to the group (its resource
    /// and scope name the outputs where it is the candidate). Within the warm-up after the
    /// replica's first point of the version the point only counts as warm-up. Returns what was
    /// evicted to make room (`max_series`, `max_versions`).
    #[allow(clippy::too_many_arguments)]
    pub fn add_from<E>(
        &mut self,
        key: Vec<String>,
        time: u64,
        value: f64,
        version: &str,
        id: u64,
        replica: u64,
        meta: impl FnOnce() -> Result<(Resource, InstrumentationScope), E>,
    ) -> Result<Result<Evicted, Skip>, E> {
        if time < self.watermark {
            return Ok(Err(Skip::Late));
        }
        let new_version = self.series.get(&key).is_none_or(|g| !g.versions.contains_key(version));
        let fresh = if new_version { Some(meta()?) } else { None };
        let mut evicted = Evicted::default();
        let w = self.params.window_ns;
        let start = time - time % w;
        let cap = self.params.max_samples;
        let seed = window_seed(&key, start);
        let side_seed = self.side_seed(seed, version);
        let (watermark, max_versions) = match self.pairing {
            Pairing::Auto { max_versions, .. } => (self.watermark, max_versions),
            Pairing::Explicit { .. } => (self.watermark, usize::MAX),
        };
        // The sequence of this touch (the map advances it by one): versions' recency is on the
        // map's clock.
        let seq = self.series.seq() + 1;
        let open = &mut self.open;
        let evict = |k: &Vec<String>, g: &Group| {
            for w in &g.windows {
                open.remove(&(w.end, k.clone()));
            }
        };
        let Some(t) = self.series.touch(&key, time, Group::new, evict) else { return Ok(Ok(evicted)) };
        if t.evicted > 0 {
            evicted.groups = t.evicted;
            let max = self.params.max_series;
            tracing::debug!(evicted = t.evicted, max_series = max, "delta_ab: evicted least recently seen groups");
        }
        let g = t.state;
        match (g.versions.get_mut(version), fresh) {
            (Some(v), _) => v.touched = seq,
            (None, fresh) => {
                if g.versions.len() >= max_versions {
                    evicted.versions = g.evict_version(watermark);
                }
                let (resource, scope) = fresh.unwrap_or_default();
                g.versions
                    .insert(version.to_string(), Version { meta: Meta { resource, scope }, seen: None, touched: seq });
            }
        }
        let i = match g.windows.iter().rposition(|x| x.start == start) {
            Some(i) => i,
            None => {
                let end = start.saturating_add(w);
                self.open.insert((end, key));
                g.windows.push(Window { start, end, sides: Vec::new() });
                g.windows.len() - 1
            }
        };
        let warm = self.params.warmup_ns;
        let in_warmup = warm > 0 && replica != 0 && {
            let k = (version.to_string(), replica);
            let room = g.first_points.len() < MAX_REPLICAS;
            match g.first_points.get_mut(&k) {
                Some(first) => {
                    *first = (*first).min(time);
                    time < first.saturating_add(warm)
                }
                None if room => {
                    g.first_points.insert(k, time);
                    true
                }
                None => false,
            }
        };
        let Some(win) = g.windows.get_mut(i) else { return Ok(Ok(evicted)) };
        let j = match win.sides.iter().position(|s| s.version == version) {
            Some(j) => j,
            None => {
                win.sides.push(VersionSide {
                    version: version.to_string(),
                    first: time,
                    last: time,
                    side: Side::new(side_seed),
                });
                win.sides.len() - 1
            }
        };
        if let Some(s) = win.sides.get_mut(j) {
            s.first = s.first.min(time);
            s.last = s.last.max(time);
            if in_warmup {
                s.side.warmup += 1;
            } else {
                s.side.add(value, id, cap);
                s.side.note_replica(replica);
            }
        }
        Ok(Ok(evicted))
    }

    /// Closes every window ending at or before `watermark`, in (end, group) order, passing each
    /// group's outputs for it to `emit`, then keeps it in the group's ring (dropping the windows
    /// no later look-back can use); then forgets idle groups. Returns the number of idle groups
    /// forgotten.
    pub fn close_until(&mut self, watermark: u64, mut emit: impl FnMut(&[String], Eval<'_>)) -> usize {
        if watermark < self.watermark {
            return 0;
        }
        self.watermark = watermark;
        let due: Vec<(u64, Vec<String>)> = self.open.iter().take_while(|(end, _)| *end <= watermark).cloned().collect();
        for (end, key) in due {
            self.open.remove(&(end, key.clone()));
            let Some(g) = self.series.get_mut(&key) else { continue };
            let Some(i) = g.windows.iter().position(|w| w.end == end) else { continue };
            let mut w = g.windows.swap_remove(i);
            let n = lookback_len(&g.ring, &w, &self.params);
            // Windows older than this look-back (by time or by `max_points`) never enter a later
            // one: later look-backs start later and hold at least these newer windows.
            let drop = g.ring.len() - n;
            g.ring.drain(..drop);
            for s in &w.sides {
                if let Some(v) = g.versions.get_mut(&s.version) {
                    v.seen = Some(v.seen.map_or((s.first, s.last), |(f, l)| (f.min(s.first), l.max(s.last))));
                }
            }
            let l = Lookback { earlier: g.ring.make_contiguous(), current: &w };
            match &self.pairing {
                Pairing::Explicit { baseline, candidate } => {
                    if let Some(v) = g.versions.get(candidate).or_else(|| g.versions.get(baseline)) {
                        emit(&key, Eval::Compare { baseline, candidate, meta: &v.meta, live: None, lookback: l });
                    }
                }
                Pairing::Auto { live_ns, max_versions } => {
                    let from = end.saturating_sub(*live_ns);
                    let live: Vec<(&str, u64)> = g
                        .versions
                        .iter()
                        .filter_map(|(name, v)| {
                            v.seen.filter(|s| s.1 >= from).map(|s| (name.as_str(), s.0 - s.0 % self.params.window_ns))
                        })
                        .collect();
                    let next = choose(&live, &l);
                    let n_live = live.len();
                    if let Some((b, c)) = g.pair.take()
                        && next.as_ref().is_none_or(|p| p.1 != c)
                        && let Some(v) = g.versions.get(&c)
                    {
                        // The pair ended; a new pair with the same candidate continues its identity.
                        let meta = v.meta.clone();
                        g.ended.retain(|e| e.candidate != c);
                        g.ended.push(Ended { baseline: b, candidate: c, meta, since: end });
                    }
                    g.pair = next;
                    let current = g.pair.as_ref().map(|p| p.1.as_str());
                    g.ended.retain(|e| end < e.since.saturating_add(*live_ns) && Some(e.candidate.as_str()) != current);
                    let excess = g.ended.len().saturating_sub(*max_versions);
                    g.ended.drain(..excess);
                    if let Some((b, c)) = &g.pair
                        && let Some(v) = g.versions.get(c)
                    {
                        let ev =
                            Eval::Compare { baseline: b, candidate: c, meta: &v.meta, live: Some(n_live), lookback: l };
                        emit(&key, ev);
                    }
                    for e in &g.ended {
                        let ev = Eval::Ended {
                            baseline: &e.baseline,
                            candidate: &e.candidate,
                            meta: &e.meta,
                            live: n_live,
                            end,
                        };
                        emit(&key, ev);
                    }
                    // Forget the versions no longer live, outside the pair and without an open window.
                    let gone: Vec<String> = g
                        .versions
                        .iter()
                        .filter(|(name, v)| {
                            v.seen.is_some_and(|s| s.1 < from)
                                && g.pair.as_ref().is_none_or(|(a, b)| a != *name && b != *name)
                                && !g.windows.iter().any(|w| w.side(name).is_some())
                        })
                        .map(|(name, _)| name.clone())
                        .collect();
                    for name in gone {
                        g.versions.remove(&name);
                        g.first_points.retain(|(v, _), _| *v != name);
                        strip(g.ring.iter_mut().chain(std::iter::once(&mut w)), &name);
                    }
                }
            }
            if self.params.lookback_ns > self.params.window_ns {
                g.ring.push_back(w);
            }
        }
        self.evict_idle()
    }

    fn evict_idle(&mut self) -> usize {
        let wm = self.watermark;
        // A group with an open window is kept at least until that window closes.
        let n = self.series.expire_idle(wm, |g| g.windows.iter().map(|w| w.end).max(), |_, _| {});
        if n > 0 {
            tracing::debug!(evicted = n, watermark = wm, "delta_ab: forgot idle groups");
        }
        n
    }

    /// Serializes the state (groups in key order, so equal states give equal bytes).
    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let header = (self.params.window_ns, self.watermark);
        self.series.snapshot(STATE_VERSION, &header, |_, g| GroupRepr {
            versions: g
                .versions
                .iter()
                .map(|(name, v)| VersionRepr {
                    name: name.clone(),
                    resource: v.meta.resource.encode_to_vec(),
                    scope: v.meta.scope.encode_to_vec(),
                    seen: v.seen,
                    touched: v.touched,
                })
                .collect(),
            windows: g.windows.clone(),
            ring: g.ring.iter().cloned().collect(),
            pair: g.pair.clone(),
            first_points: g.first_points.iter().map(|((v, r), t)| (v.clone(), *r, *t)).collect(),
            ended: g
                .ended
                .iter()
                .map(|e| EndedRepr {
                    baseline: e.baseline.clone(),
                    candidate: e.candidate.clone(),
                    resource: e.meta.resource.encode_to_vec(),
                    scope: e.meta.scope.encode_to_vec(),
                    since: e.since,
                })
                .collect(),
        })
    }

    /// Replaces the state with a snapshot; the state is unchanged on error.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), RestoreError> {
        let ((window_ns, watermark), series): ((u64, u64), _) =
            self.series.restore(STATE_VERSION, bytes, |_, g: GroupRepr| Group::from_repr(g))?;
        let w = self.params.window_ns;
        if window_ns != w {
            return Err(RestoreError::Params { what: "window", found: window_ns, expected: w });
        }
        let valid = |win: &Window, versions: &BTreeMap<String, Version>| {
            let sides_ok = win.sides.iter().enumerate().all(|(i, s)| {
                let side = &s.side;
                side.values.len() == side.ids.len()
                    && side.values.len() as u64 <= side.seen
                    && side.replicas.len() <= MAX_REPLICAS
                    && side.replicas.windows(2).all(|p| p[0] < p[1])
                    && win.start <= s.first
                    && s.first <= s.last
                    && s.last < win.end
                    && versions.contains_key(&s.version)
                    && !win.sides[..i].iter().any(|o| o.version == s.version)
            });
            win.start.is_multiple_of(w) && win.end == win.start.saturating_add(w) && sides_ok
        };
        let mut open = BTreeSet::new();
        for (key, slot) in series.iter() {
            let g = &slot.state;
            for win in &g.windows {
                if !valid(win, &g.versions) || win.end <= watermark {
                    return Err(RestoreError::Invalid("window"));
                }
                if !open.insert((win.end, key.clone())) {
                    return Err(RestoreError::Invalid("duplicate window"));
                }
            }
            let mut prev_end = 0;
            for win in &g.ring {
                if !valid(win, &g.versions) || win.start < prev_end || win.end > watermark {
                    return Err(RestoreError::Invalid("look-back window"));
                }
                prev_end = win.end;
            }
            if let Some((b, c)) = &g.pair
                && (b == c || !g.versions.contains_key(b) || !g.versions.contains_key(c))
            {
                return Err(RestoreError::Invalid("pair"));
            }
        }
        self.series = series;
        self.open = open;
        self.watermark = watermark;
        Ok(())
    }
}

impl Group {
    /// A group from its checkpoint form (the checks that need the window and the watermark are
    /// the caller's).
    fn from_repr(g: GroupRepr) -> Result<Group, RestoreError> {
        let mut versions = BTreeMap::new();
        for v in g.versions {
            if v.seen.is_some_and(|(f, l)| f > l) {
                return Err(RestoreError::Invalid("version"));
            }
            let meta = Meta {
                resource: Resource::decode(v.resource.as_slice())?,
                scope: InstrumentationScope::decode(v.scope.as_slice())?,
            };
            if versions.insert(v.name, Version { meta, seen: v.seen, touched: v.touched }).is_some() {
                return Err(RestoreError::Invalid("duplicate version"));
            }
        }
        let mut ended = Vec::with_capacity(g.ended.len());
        for e in g.ended {
            let meta = Meta {
                resource: Resource::decode(e.resource.as_slice())?,
                scope: InstrumentationScope::decode(e.scope.as_slice())?,
            };
            ended.push(Ended { baseline: e.baseline, candidate: e.candidate, meta, since: e.since });
        }
        let mut first_points = BTreeMap::new();
        for (v, r, t) in g.first_points {
            if !versions.contains_key(&v) || first_points.insert((v, r), t).is_some() {
                return Err(RestoreError::Invalid("first point"));
            }
        }
        if first_points.len() > MAX_REPLICAS {
            return Err(RestoreError::Invalid("first points"));
        }
        Ok(Group { versions, windows: g.windows, ring: g.ring.into(), pair: g.pair, ended, first_points })
    }
}

/// One group in checkpoints (the kit's envelope holds its key, last event time and recency).
#[derive(Serialize, Deserialize)]
struct GroupRepr {
    versions: Vec<VersionRepr>,
    windows: Vec<Window>,
    ring: Vec<Window>,
    pair: Option<(String, String)>,
    first_points: Vec<(String, u64, u64)>,
    ended: Vec<EndedRepr>,
}

#[derive(Serialize, Deserialize)]
struct VersionRepr {
    name: String,
    resource: Vec<u8>,
    scope: Vec<u8>,
    seen: Option<(u64, u64)>,
    touched: u64,
}

#[derive(Serialize, Deserialize)]
struct EndedRepr {
    baseline: String,
    candidate: String,
    resource: Vec<u8>,
    scope: Vec<u8>,
    since: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn params(max_series: usize, max_samples: usize) -> Params {
        Params {
            window_ns: 60 * S,
            idle_ns: 120 * S,
            max_series,
            max_samples,
            lookback_ns: 60 * S,
            max_points: 1000,
            warmup_ns: 0,
        }
    }

    fn explicit() -> Pairing {
        Pairing::Explicit { baseline: "A".into(), candidate: "B".into() }
    }

    fn meta() -> Result<(Resource, InstrumentationScope), ()> {
        Ok((Resource::default(), InstrumentationScope::default()))
    }

    fn key(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    /// The look-back of a comparison (other outputs: `None`).
    fn compared(ev: Eval<'_>) -> Option<Lookback<'_>> {
        match ev {
            Eval::Compare { lookback, .. } => Some(lookback),
            Eval::Ended { .. } => None,
        }
    }

    #[test]
    fn reservoir_keeps_the_cap_and_counts_every_point() {
        let mut st = State::new(params(10, 50), explicit());
        for i in 0..1000 {
            st.add(key("m"), S + i, i as f64, "A", 0, meta).unwrap().unwrap();
        }
        let mut got = Vec::new();
        st.close_until(60 * S, |_, ev| {
            let w = compared(ev).unwrap().current;
            let a = w.side("A").unwrap();
            got.push((a.seen, a.values.len(), w.side("B").is_none(), a.values.clone()))
        });
        assert_eq!(got.len(), 1);
        let (seen, kept, no_b, values) = &got[0];
        assert_eq!((*seen, *kept, *no_b), (1000, 50, true));
        assert!(values.iter().any(|&v| v >= 50.0), "later points enter the reservoir");
    }

    #[test]
    fn evicts_least_recent_and_forgets_idle_groups() {
        let mut st = State::new(params(10, 100), explicit());
        for g in 0..10 {
            st.add(key(&g.to_string()), S, 1.0, "A", 0, meta).unwrap().unwrap();
        }
        st.add(key("0"), S, 1.0, "B", 0, meta).unwrap().unwrap();
        assert_eq!(st.add(key("new"), S, 1.0, "A", 0, meta).unwrap(), Ok(Evicted { groups: 1, versions: 0 }));
        assert_eq!(st.series_count(), 10);
        let mut keys = Vec::new();
        st.close_until(60 * S, |k, _| keys.push(k[0].clone()));
        assert!(!keys.contains(&"1".to_string()) && keys.contains(&"0".to_string()), "{keys:?}");
        assert_eq!(st.add(key("0"), 59 * S, 1.0, "A", 0, meta).unwrap(), Err(Skip::Late));
        assert_eq!(st.close_until(121 * S, |_, _| {}), 10, "no point for idle_timeout");
        assert_eq!(st.series_count(), 0);
    }

    /// Starts (in windows) of the earlier windows and of the current one at each close.
    fn close_all(st: &mut State, until: u64) -> Vec<(Vec<u64>, u64, f64)> {
        let mut got = Vec::new();
        st.close_until(until, |_, ev| {
            let Some(l) = compared(ev) else { return };
            let earlier = l.earlier.iter().map(|w| w.start / (60 * S)).collect();
            got.push((earlier, l.current.start / (60 * S), (l.current.end - l.start()) as f64 / 1e9));
        });
        got
    }

    #[test]
    fn lookback_holds_the_last_windows_and_skips_gaps() {
        let mut st = State::new(Params { lookback_ns: 180 * S, ..params(10, 100) }, explicit());
        // Points in windows 0, 1, 2, 3 and 6 (none in 4 and 5).
        for w in [0u64, 1, 2, 3, 6] {
            st.add(key("m"), w * 60 * S + S, 1.0, "A", 0, meta).unwrap().unwrap();
        }
        let got = close_all(&mut st, 7 * 60 * S);
        assert_eq!(
            got,
            vec![
                (vec![], 0, 60.0),
                (vec![0], 1, 120.0),
                (vec![0, 1], 2, 180.0),
                (vec![1, 2], 3, 180.0),
                // Window 6's look-back [4, 7) holds no earlier window.
                (vec![], 6, 60.0),
            ]
        );
        assert_eq!(st.series.get(&key("m")).unwrap().ring.len(), 1, "expired windows leave the ring");
    }

    #[test]
    fn max_points_drops_the_oldest_windows() {
        let mut st = State::new(Params { lookback_ns: 600 * S, max_points: 25, ..params(10, 10) }, explicit());
        for w in 0u64..5 {
            for i in 0..10 {
                st.add(key("m"), w * 60 * S + i, 1.0, "B", 0, meta).unwrap().unwrap();
            }
        }
        let got = close_all(&mut st, 5 * 60 * S);
        // 10 values per window, at most 25 per version: the current window and one earlier one.
        let earlier: Vec<Vec<u64>> = got.iter().map(|g| g.0.clone()).collect();
        assert_eq!(earlier, vec![vec![], vec![0], vec![1], vec![2], vec![3]]);
        assert_eq!(got[4].2, 120.0, "the span actually used");
        let g = st.series.get(&key("m")).unwrap();
        assert!(g.ring.iter().filter_map(|w| w.side("B")).map(|s| s.values.len()).sum::<usize>() <= 25);
    }

    #[test]
    fn snapshot_keeps_the_ring_and_refuses_a_broken_one() {
        let mut st = State::new(Params { lookback_ns: 180 * S, ..params(10, 100) }, explicit());
        for w in 0u64..3 {
            st.add(key("m"), w * 60 * S, w as f64, "A", 7, meta).unwrap().unwrap();
        }
        close_all(&mut st, 2 * 60 * S);
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(Params { lookback_ns: 180 * S, ..params(10, 100) }, explicit());
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
        assert_eq!(close_all(&mut other, 3 * 60 * S), close_all(&mut st, 3 * 60 * S));
        // Swap the ring's two windows: out of order.
        let ring = &mut st.series.get_mut(&key("m")).unwrap().ring;
        ring.make_contiguous().reverse();
        let broken = st.snapshot().unwrap();
        assert!(matches!(other.restore(&broken), Err(RestoreError::Invalid("look-back window"))));
        // A window of a version missing from the version table.
        let mut orphaned = State::new(Params { lookback_ns: 180 * S, ..params(10, 100) }, explicit());
        orphaned.restore(&bytes).unwrap();
        orphaned.series.get_mut(&key("m")).unwrap().versions.clear();
        let orphan = orphaned.snapshot().unwrap();
        assert!(matches!(other.restore(&orphan), Err(RestoreError::Invalid(_))));
    }

    #[test]
    fn snapshot_round_trips_and_refuses_another_window() {
        let mut st = State::new(params(10, 100), explicit());
        st.add(key("m"), S, 1.0, "A", 7, meta).unwrap().unwrap();
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(params(10, 100), explicit());
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
        let mut wrong = State::new(Params { window_ns: 30 * S, ..params(10, 100) }, explicit());
        assert!(matches!(wrong.restore(&bytes), Err(RestoreError::Params { what: "window", .. })));
        assert!(other.restore(&bytes[..bytes.len() - 2]).is_err());
    }

    #[test]
    fn natural_order_compares_digit_runs_as_numbers() {
        for (a, b) in [("v1", "v2"), ("v9", "v10"), ("1.9.0", "1.10.0"), ("v2", "v2-rc"), ("a", "b"), ("v01", "v1")] {
            assert_eq!(natural_cmp(a, b), Ordering::Less, "{a} < {b}");
            assert_eq!(natural_cmp(b, a), Ordering::Greater, "{b} > {a}");
        }
        assert_eq!(natural_cmp("v3", "v3"), Ordering::Equal);
    }

    #[test]
    fn versions_first_seen_in_one_window_pair_by_name() {
        // v10 has the earlier point, but both start in window 0: v9 is the older.
        let mut st = State::new(params(10, 100), auto(600, 8));
        st.add(key("m"), S, 1.0, "v10", 0, meta).unwrap().unwrap();
        st.add(key("m"), 2 * S, 1.0, "v9", 0, meta).unwrap().unwrap();
        assert_eq!(outputs(&mut st, 60 * S), vec![o("compare", "v9", "v10", 1)]);
    }

    fn auto(live_s: u64, max_versions: usize) -> Pairing {
        Pairing::Auto { live_ns: live_s * S, max_versions }
    }

    /// Each output of the windows closed up to `until`: ("compare" | "ended", baseline, candidate,
    /// window end in minutes).
    fn outputs(st: &mut State, until: u64) -> Vec<(&'static str, String, String, u64)> {
        let mut got = Vec::new();
        st.close_until(until, |_, ev| match ev {
            Eval::Compare { baseline, candidate, lookback, .. } => {
                got.push(("compare", baseline.to_string(), candidate.to_string(), lookback.current.end / (60 * S)))
            }
            Eval::Ended { baseline, candidate, end, .. } => {
                got.push(("ended", baseline.to_string(), candidate.to_string(), end / (60 * S)))
            }
        });
        got
    }

    fn o(kind: &'static str, b: &str, c: &str, m: u64) -> (&'static str, String, String, u64) {
        (kind, b.into(), c.into(), m)
    }

    #[test]
    fn auto_pairs_the_two_live_versions_and_ends_when_one_stops() {
        // Live for 2 windows; v1 in windows 0..=2, v2 from window 1 to 6.
        let mut st = State::new(Params { idle_ns: 3600 * S, ..params(10, 100) }, auto(120, 8));
        for w in 0u64..7 {
            let t = w * 60 * S + 30 * S;
            if w <= 2 {
                st.add(key("m"), t, 1.0, "v1", 0, meta).unwrap().unwrap();
            }
            if w >= 1 {
                st.add(key("m"), t + S, 1.0, "v2", 0, meta).unwrap().unwrap();
            }
        }
        let got = outputs(&mut st, 7 * 60 * S);
        assert_eq!(
            got,
            vec![
                // Window 0: v1 alone, nothing compared.
                o("compare", "v1", "v2", 2),
                o("compare", "v1", "v2", 3),
                // v1's last point (2:30) is within 2 min of 4:00 but not of 5:00.
                o("compare", "v1", "v2", 4),
                o("ended", "v1", "v2", 5),
                o("ended", "v1", "v2", 6),
            ]
        );
        assert!(!st.series.get(&key("m")).unwrap().versions.contains_key("v1"), "v1 is forgotten once not live");
        assert!(outputs(&mut st, 8 * 60 * S).is_empty());
    }

    #[test]
    fn auto_with_three_live_compares_the_newest_against_the_most_seen() {
        let mut st = State::new(Params { lookback_ns: 180 * S, ..params(10, 100) }, auto(180, 8));
        // v1 oldest with 1 point per window, v2 with 5, then v3 new in window 1.
        for w in 0u64..2 {
            let t = w * 60 * S;
            st.add(key("m"), t, 1.0, "v1", 0, meta).unwrap().unwrap();
            for i in 0..5 {
                st.add(key("m"), t + S + i, 1.0, "v2", 0, meta).unwrap().unwrap();
            }
        }
        st.add(key("m"), 60 * S + 10 * S, 1.0, "v3", 0, meta).unwrap().unwrap();
        let got = outputs(&mut st, 2 * 60 * S);
        assert_eq!(got, vec![o("compare", "v1", "v2", 1), o("compare", "v2", "v3", 2), o("ended", "v1", "v2", 2)]);
    }

    #[test]
    fn max_versions_evicts_the_least_recent_outside_the_pair() {
        let mut st = State::new(params(10, 100), auto(600, 3));
        for (i, v) in ["a", "b", "c"].iter().enumerate() {
            st.add(key("m"), S + i as u64, 1.0, v, 0, meta).unwrap().unwrap();
        }
        // One point each: the newest against the oldest.
        assert_eq!(outputs(&mut st, 60 * S), vec![o("compare", "a", "c", 1)]);
        st.add(key("m"), 61 * S, 1.0, "a", 0, meta).unwrap().unwrap();
        st.add(key("m"), 62 * S, 1.0, "b", 0, meta).unwrap().unwrap();
        st.add(key("m"), 63 * S, 1.0, "c", 0, meta).unwrap().unwrap();
        // "a" is the least recently seen, but it is in the pair: "b" goes.
        let e = st.add(key("m"), 64 * S, 1.0, "d", 0, meta).unwrap().unwrap();
        assert_eq!(e, Evicted { groups: 0, versions: 1 });
        let g = st.series.get(&key("m")).unwrap();
        assert_eq!(g.versions.keys().map(String::as_str).collect::<Vec<_>>(), vec!["a", "c", "d"]);
        assert!(g.windows.iter().chain(&g.ring).all(|w| w.side("b").is_none()), "its values leave with it");
    }

    #[test]
    fn auto_snapshot_keeps_the_version_table_and_the_ended_pairs() {
        let mut st = State::new(params(10, 100), auto(120, 8));
        for w in 0u64..4 {
            if w <= 1 {
                st.add(key("m"), w * 60 * S, 1.0, "v1", 0, meta).unwrap().unwrap();
            }
            st.add(key("m"), w * 60 * S + S, 1.0, "v2", 0, meta).unwrap().unwrap();
        }
        let head = outputs(&mut st, 2 * 60 * S);
        assert_eq!(head, vec![o("compare", "v1", "v2", 1), o("compare", "v1", "v2", 2)]);
        let bytes = st.snapshot().unwrap();
        let mut other = State::new(params(10, 100), auto(120, 8));
        other.restore(&bytes).unwrap();
        assert_eq!(other.snapshot().unwrap(), bytes);
        assert_eq!(other.series.slot(&key("m")), st.series.slot(&key("m")), "the version table and pair survive");
        assert_eq!(other.series.len(), st.series.len());
        assert_eq!(outputs(&mut other, 4 * 60 * S), outputs(&mut st, 4 * 60 * S));
    }
}

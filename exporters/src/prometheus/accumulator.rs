//! The latest state of every series the `prometheus` exporter serves.
//!
//! Points arrive cumulative (see [`super::cumulative`]): each replaces the stored one unless it
//! is older (an older point with the same value only keeps the series alive). A series not updated for `metric_expiration` (wall clock) disappears; at most
//! `max_series` series are held and points of new series beyond that are refused.

use super::translate::{FamilyType, Labels, Point, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// What became of one point offered to the accumulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stored (a new series or a newer point).
    Stored,
    /// The point is older than the stored one: ignored.
    Stale,
    /// The series ended (no recorded value): removed.
    Removed,
    /// A new series while `max_series` are held: refused.
    OverLimit,
    /// The family name is already used by a family of another type: refused.
    TypeConflict,
}

/// The stored state of one series.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Start of the cumulative interval (0: unknown).
    pub start_ns: u64,
    /// Time of the latest point.
    pub time_ns: u64,
    /// The latest value.
    pub value: Value,
    updated: Instant,
}

/// The stored series of one family.
#[derive(Debug, Clone)]
pub struct FamilyState {
    /// The Prometheus type.
    pub kind: FamilyType,
    /// The help text (the latest description seen).
    pub help: String,
    /// Series by labels.
    pub series: HashMap<Labels, Series>,
}

/// Latest state per series, by family name.
#[derive(Debug)]
pub struct Accumulator {
    families: BTreeMap<String, FamilyState>,
    len: usize,
    max_series: usize,
    expiration: Duration,
}

impl Accumulator {
    /// An empty accumulator.
    pub fn new(max_series: usize, expiration: Duration) -> Self {
        Accumulator { families: BTreeMap::new(), len: 0, max_series, expiration }
    }

    /// Number of series held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no series is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Families in name order.
    pub fn families(&self) -> impl Iterator<Item = (&String, &FamilyState)> {
        self.families.iter()
    }

    /// The stored series `name{labels}`, if any.
    pub fn get(&self, name: &str, labels: &Labels) -> Option<&Series> {
        self.families.get(name).and_then(|f| f.series.get(labels))
    }

    /// Offers one point, received at `now`.
    pub fn add(&mut self, p: Point, now: Instant) -> Outcome {
        let Point { family, labels, start_ns, time_ns, value, stale } = p;
        if let Some(f) = self.families.get_mut(&family.name) {
            if f.kind != family.kind {
                return Outcome::TypeConflict;
            }
            if stale {
                if f.series.remove(&labels).is_some() {
                    self.len -= 1;
                }
                if f.series.is_empty() {
                    self.families.remove(&family.name);
                }
                return Outcome::Removed;
            }
            if !family.help.is_empty() {
                f.help.clone_from(&family.help);
            }
            if let Some(s) = f.series.get_mut(&labels) {
                if time_ns < s.time_ns {
                    if s.value == value {
                        // Nothing new, but the series is still reported (e.g. `target_info`
                        // of a resource whose latest points are older): it stays alive.
                        s.updated = now;
                        return Outcome::Stored;
                    }
                    return Outcome::Stale;
                }
                *s = Series { start_ns, time_ns, value, updated: now };
                return Outcome::Stored;
            }
            if self.len >= self.max_series {
                return Outcome::OverLimit;
            }
            f.series.insert(labels, Series { start_ns, time_ns, value, updated: now });
            self.len += 1;
            return Outcome::Stored;
        }
        if stale {
            return Outcome::Removed;
        }
        if self.len >= self.max_series {
            return Outcome::OverLimit;
        }
        let mut series = HashMap::new();
        series.insert(labels, Series { start_ns, time_ns, value, updated: now });
        self.families.insert(family.name.clone(), FamilyState { kind: family.kind, help: family.help.clone(), series });
        self.len += 1;
        Outcome::Stored
    }

    /// Removes the series not updated for `metric_expiration` before `now`; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let exp = self.expiration;
        let mut removed = 0;
        self.families.retain(|_, f| {
            let before = f.series.len();
            f.series.retain(|_, s| now.saturating_duration_since(s.updated) < exp);
            removed += before - f.series.len();
            !f.series.is_empty()
        });
        self.len -= removed;
        removed
    }
}

//! The good / total events of one SLO group over time, and the multiwindow, multi-burn-rate
//! rules of the Google SRE Workbook on them.
//!
//! Events are kept in minute buckets for the last 6 h and in hour buckets for the longer of the
//! period and 3 d. A window of at most 6 h ending at event time `t` holds the minute buckets
//! `(⌊t/1m⌋ − w/1m, ⌊t/1m⌋]`; a longer window the hour buckets `(⌊t/1h⌋ − w/1h, ⌊t/1h⌋]` (the
//! current minute or hour counts from its start). Memory per group: 360 minute and
//! max(period, 72 h) hour buckets of 24 bytes.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

const MIN_NS: u64 = 60_000_000_000;
const HOUR_NS: u64 = 60 * MIN_NS;
/// Minutes kept at minute resolution.
pub const MINUTE_SPAN: u64 = 360;

/// Good and total events (fractional when derived from rates).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Counts {
    /// Good events.
    pub good: f64,
    /// All events.
    pub total: f64,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.good += o.good;
        self.total += o.total;
    }

    /// Bad events.
    pub fn bad(&self) -> f64 {
        (self.total - self.good).max(0.0)
    }

    /// Burn rate against `target`: the bad ratio divided by the allowed bad ratio (0 without events).
    pub fn burn_rate(&self, target: f64) -> f64 {
        if self.total <= 0.0 { 0.0 } else { (self.bad() / self.total) / (1.0 - target) }
    }
}

/// A window of the burn-rate rules, in minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Label (`5m`, `1h`, `3d`).
    pub label: &'static str,
    /// Length in minutes.
    pub minutes: u64,
}

/// The windows every rule reads, shortest first.
pub const WINDOWS: [Window; 7] = [
    Window { label: "5m", minutes: 5 },
    Window { label: "30m", minutes: 30 },
    Window { label: "1h", minutes: 60 },
    Window { label: "2h", minutes: 120 },
    Window { label: "6h", minutes: 360 },
    Window { label: "1d", minutes: 1440 },
    Window { label: "3d", minutes: 4320 },
];

/// One multiwindow rule: both windows' burn rates at or above `factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// `page` or `ticket`.
    pub severity: Severity,
    /// Index of the long window in [`WINDOWS`].
    pub long: usize,
    /// Index of the short window in [`WINDOWS`].
    pub short: usize,
    /// Burn-rate factor.
    pub factor: f64,
}

/// Severity of a burn-rate rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Slow burn: a ticket.
    Ticket,
    /// Fast burn: a page.
    Page,
}

/// The SRE Workbook's rules (table 5-8): page 1h/5m at 14.4× and 6h/30m at 6×; ticket 1d/2h at
/// 3× and 3d/6h at 1×.
pub const RULES: [Rule; 4] = [
    Rule { severity: Severity::Page, long: 2, short: 0, factor: 14.4 },
    Rule { severity: Severity::Page, long: 4, short: 1, factor: 6.0 },
    Rule { severity: Severity::Ticket, long: 5, short: 3, factor: 3.0 },
    Rule { severity: Severity::Ticket, long: 6, short: 4, factor: 1.0 },
];

/// The events of one group.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Ledger {
    /// (minute index, counts), increasing, the last [`MINUTE_SPAN`] minutes.
    minutes: VecDeque<(u64, Counts)>,
    /// (hour index, counts), increasing, the last `hours` hours.
    hours: VecDeque<(u64, Counts)>,
    /// Every event since the group was first seen (the exported cumulative counters).
    pub cumulative: Counts,
    /// Event time of the first event, ns.
    pub first_ns: u64,
    /// Largest event time seen, ns.
    pub last_ns: u64,
}

fn insert(q: &mut VecDeque<(u64, Counts)>, idx: u64, c: Counts) {
    match q.iter().rposition(|&(i, _)| i <= idx) {
        Some(p) if q[p].0 == idx => q[p].1.add(c),
        Some(p) => q.insert(p + 1, (idx, c)),
        None => q.push_front((idx, c)),
    }
}

fn sum_since(q: &VecDeque<(u64, Counts)>, from_exclusive: Option<u64>, to: u64) -> Counts {
    let mut s = Counts::default();
    for &(i, c) in q.iter().rev() {
        if i > to {
            continue;
        }
        if from_exclusive.is_some_and(|f| i <= f) {
            break;
        }
        s.add(c);
    }
    s
}

impl Ledger {
    /// Adds events at event time `t_ns`; `keep_hours` is how many hour buckets to keep.
    pub fn add(&mut self, t_ns: u64, c: Counts, keep_hours: u64) {
        if self.cumulative.total == 0.0 && self.minutes.is_empty() && self.hours.is_empty() {
            self.first_ns = t_ns;
        }
        self.first_ns = self.first_ns.min(t_ns);
        self.last_ns = self.last_ns.max(t_ns);
        self.cumulative.add(c);
        let (m, h) = (t_ns / MIN_NS, t_ns / HOUR_NS);
        let (now_m, now_h) = (self.last_ns / MIN_NS, self.last_ns / HOUR_NS);
        if m + MINUTE_SPAN > now_m {
            insert(&mut self.minutes, m, c);
        }
        if h + keep_hours > now_h {
            insert(&mut self.hours, h, c);
        }
        while self.minutes.front().is_some_and(|&(i, _)| i + MINUTE_SPAN <= now_m) {
            self.minutes.pop_front();
        }
        while self.hours.front().is_some_and(|&(i, _)| i + keep_hours <= now_h) {
            self.hours.pop_front();
        }
    }

    /// The events of the `minutes`-long window ending at `t_ns` (see the module docs).
    pub fn window(&self, t_ns: u64, minutes: u64) -> Counts {
        if minutes <= MINUTE_SPAN {
            let to = t_ns / MIN_NS;
            sum_since(&self.minutes, to.checked_sub(minutes), to)
        } else {
            let to = t_ns / HOUR_NS;
            sum_since(&self.hours, to.checked_sub(minutes.div_ceil(60)), to)
        }
    }

    /// The burn-rate view at `t_ns`: every window's burn rate and the strongest rule that holds.
    pub fn assess(&self, t_ns: u64, target: f64, period_hours: u64) -> Assessment {
        let mut burn = [0.0; WINDOWS.len()];
        for (b, w) in burn.iter_mut().zip(WINDOWS) {
            *b = self.window(t_ns, w.minutes).burn_rate(target);
        }
        let period = self.window(t_ns, period_hours * 60);
        let budget_remaining = if period.total <= 0.0 { 1.0 } else { 1.0 - period.burn_rate(target) };
        let mut fired: Option<Rule> = None;
        let mut score = 0.0f64;
        // With little history a long window's ratio is that of a few events (one bad minute in a
        // new group's first hour would burn its 3-day window 1.7×): a rule holds only once the
        // group's events span half of its long window.
        let span_min = t_ns.saturating_sub(self.first_ns) / MIN_NS;
        for r in RULES {
            if span_min * 2 < WINDOWS[r.long].minutes {
                continue;
            }
            let held = burn[r.long].min(burn[r.short]) / r.factor;
            score = score.max(held);
            if held >= 1.0 && fired.is_none_or(|f| r.severity > f.severity) {
                fired = Some(r);
            }
        }
        Assessment { burn, budget_remaining, period, fired, score }
    }

    /// Buckets held (minute and hour), for the state-size figures.
    pub fn buckets(&self) -> usize {
        self.minutes.len() + self.hours.len()
    }
}

/// What the rules say at one event time.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Burn rate per window of [`WINDOWS`].
    pub burn: [f64; WINDOWS.len()],
    /// 1 − bad / allowed bad over the period (1: untouched, 0: spent, < 0: overspent).
    pub budget_remaining: f64,
    /// The period's events.
    pub period: Counts,
    /// The most severe rule that holds.
    pub fired: Option<Rule>,
    /// Largest min(long, short) / factor over the rules whose long window is half covered (≥ 1: a rule holds).
    pub score: f64,
}

impl Assessment {
    /// The level for the alerts connector: 1 for a page, 0.7 for a ticket, else below 0.5.
    pub fn level(&self) -> f64 {
        match self.fired.map(|r| r.severity) {
            Some(Severity::Page) => 1.0,
            Some(Severity::Ticket) => 0.7,
            None => 0.5 * self.score.clamp(0.0, 1.0) * 0.99,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The window by its definition, over the raw events.
    fn brute(events: &[(u64, Counts)], t: u64, minutes: u64) -> Counts {
        let mut s = Counts::default();
        let (unit, n) = if minutes <= MINUTE_SPAN { (MIN_NS, minutes) } else { (HOUR_NS, minutes.div_ceil(60)) };
        let to = t / unit;
        for &(e, c) in events {
            let i = e / unit;
            if i <= to && i + n > to {
                s.add(c);
            }
        }
        s
    }

    #[test]
    fn a_fast_burn_pages_and_a_slow_one_tickets() {
        let mut l = Ledger::default();
        // 3 days of good minutes, then 10 bad minutes of 10.
        let day = 1440;
        for m in 0..3 * day {
            l.add(m * MIN_NS, Counts { good: 1.0, total: 1.0 }, 672);
        }
        let t0 = 3 * day * MIN_NS;
        let a = l.assess(t0 - MIN_NS, 0.99, 672);
        assert_eq!((a.fired, a.budget_remaining), (None, 1.0));
        for m in 0..10 {
            l.add(t0 + m * MIN_NS, Counts { good: 0.0, total: 1.0 }, 672);
        }
        let a = l.assess(t0 + 9 * MIN_NS, 0.99, 672);
        // 1h: 10 bad of 60 → burn 16.7 ≥ 14.4; 5m: 5 of 5 → 100.
        assert!((a.burn[2] - 1000.0 / 60.0).abs() < 1e-9 && (a.burn[0] - 100.0).abs() < 1e-9);
        assert_eq!(a.fired.map(|r| (r.severity, r.factor)), Some((Severity::Page, 14.4)));
        assert_eq!(a.level(), 1.0);
        // 8 bad minutes would not page on 1h (8/60 → 13.3) but the 6h/30m rule needs 6×: 8/30 → 26.7 and 8/360 → 2.2.
        let mut slow = Ledger::default();
        // 2 % bad, evenly, for 3 days: burn 2 on every window → the 3d/6h ticket rule (1×) only.
        for m in 0..3 * day {
            let bad = m.is_multiple_of(50);
            slow.add(m * MIN_NS, Counts { good: if bad { 0.0 } else { 1.0 }, total: 1.0 }, 672);
        }
        let a = slow.assess((3 * day - 1) * MIN_NS, 0.99, 672);
        assert_eq!(a.fired.map(|r| (r.severity, r.factor)), Some((Severity::Ticket, 1.0)));
        assert_eq!(a.level(), 0.7);
        assert!(a.budget_remaining < 1.0 && a.budget_remaining > -2.0);
    }

    #[test]
    fn a_new_group_needs_history_before_a_rule_holds() {
        let mut l = Ledger::default();
        // A bad first minute, then good ones: the windows burn, but no rule's long window is half covered.
        l.add(0, Counts { good: 0.0, total: 1.0 }, 672);
        for m in 1..29 {
            l.add(m * MIN_NS, Counts { good: 1.0, total: 1.0 }, 672);
            let a = l.assess(m * MIN_NS, 0.99, 672);
            assert!(a.burn[6] > 1.0 && a.fired.is_none(), "minute {m}: {a:?}");
        }
        // 30 minutes of bad events later the 1h/5m page holds (its 1 h window is half covered).
        for m in 29..40 {
            l.add(m * MIN_NS, Counts { good: 0.0, total: 1.0 }, 672);
        }
        assert_eq!(l.assess(39 * MIN_NS, 0.99, 672).fired.map(|r| r.factor), Some(14.4));
    }

    #[test]
    fn no_events_burn_nothing() {
        let l = Ledger::default();
        let a = l.assess(5 * HOUR_NS, 0.999, 24);
        assert_eq!((a.burn, a.fired, a.budget_remaining), ([0.0; 7], None, 1.0));
        assert!(a.level() < 0.5);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Every window at every evaluation time equals the brute-force sum over the raw events,
        /// with gaps, events on bucket edges and out-of-order events within an hour.
        #[test]
        fn windows_equal_brute_force(
            steps in proptest::collection::vec((0u64..3 * HOUR_NS, 0u8..3, any::<bool>(), 0u64..MIN_NS * 50), 1..120),
            keep_hours in 72u64..200,
        ) {
            let mut l = Ledger::default();
            let mut events: Vec<(u64, Counts)> = Vec::new();
            let mut t = 0u64;
            for (gap, kind, edge, back) in steps {
                t += gap;
                let at = if edge { t - t % MIN_NS } else { t };
                // Sometimes an event a little in the past (late within an hour).
                let at = if kind == 2 { at.saturating_sub(back) } else { at };
                let c = Counts { good: if kind == 0 { 1.0 } else { 0.0 }, total: 1.0 };
                l.add(at, c, keep_hours);
                events.push((at, c));
                let now = l.last_ns;
                for w in WINDOWS.iter().map(|w| w.minutes).chain([keep_hours * 60]) {
                    let got = l.window(now, w);
                    let want = brute(&events, now, w);
                    prop_assert!((got.good - want.good).abs() < 1e-9 && (got.total - want.total).abs() < 1e-9,
                        "window {w} min at {now}: {got:?} != {want:?}");
                }
                let total: f64 = events.iter().map(|e| e.1.total).sum();
                prop_assert!((l.cumulative.total - total).abs() < 1e-9);
            }
        }
    }
}

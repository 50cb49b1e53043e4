//! The NAB scorer against hand-computed numbers, NAB's null and perfect detectors, a brute-force
//! reading of NAB's rules on random corpora, the real corpus's shape, and the runner end to end.

use inferwatch_eval::nab::data::{self, NabCorpus, NabFile};
use inferwatch_eval::nab::score::{self, FileInput, PROFILES, REWARD_LOW_FN, REWARD_LOW_FP, STANDARD};
use inferwatch_eval::nab::{run, score_runs};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

const MIN: u64 = 60_000_000_000;

fn nab_dir() -> PathBuf {
    std::env::var_os("NAB_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/work/shared/datasets/nab"))
}

/// The tiny file: 20 rows one minute apart, one window on rows 8..=11 (width 4, right index 11).
fn tiny_file() -> NabFile {
    NabFile {
        name: "tiny/a.csv".into(),
        timestamps: (0..20).map(|i| i * MIN).collect(),
        values: vec![0.0; 20],
        windows: vec![(8 * MIN, 11 * MIN)],
    }
}

/// Detections: row 1 (probation: floor(0.15·20) = 3 rows, ignored), row 5 (before any window),
/// rows 9 and 10 (in the window), row 13 at a lower score 0.6, row 19.
fn tiny_scores() -> Vec<f64> {
    let mut s = vec![0.0; 20];
    for i in [1, 5, 9, 10, 19] {
        s[i] = 1.0;
    }
    s[13] = 0.6;
    s
}

fn input<'a>(f: &'a NabFile, scores: &'a [f64]) -> FileInput<'a> {
    FileInput { name: &f.name, timestamps: &f.timestamps, windows: &f.windows, scores }
}

// Hand computation, S(y) = 2/(1+e^{5y}) − 1, maxTP = S(−1) = 0.98661429815143:
//   row 5:  no window before it: −1 · A_FP
//   row 9:  first detection in the window, y = −(11 − 9 + 1)/4 = −0.75, S = 0.95404526017995,
//           earns A_TP · S/maxTP = 0.96698908780006 (row 10 is later in the same window: ignored)
//   row 19: y = |11 − 19|/(4 − 1) = 8/3, S = −0.99999676081166, costs A_FP · 0.99999676081166
//   row 13: y = 2/3, S = −0.93110960866758; detected only at thresholds ≤ 0.6, which lowers the total,
//           and threshold 0 detects 15 more FP rows, so the optimum is the threshold 1.0.
// standard (A_FP 0.11):      −0.11 + 0.96698908780006 − 0.11·0.99999676081166 = 0.74698944411078
// reward_low_FP (A_FP 0.22): −0.22 + 0.96698908780006 − 0.22·0.99999676081166 = 0.52698980042150
// reward_low_FN: as standard (A_FN only enters through missed windows) = 0.74698944411078
// Null detector (0.5 everywhere), best of "nothing" (−A_FN) and "everything": the window earns 1
// (row 8, its left edge), rows 3..=7 cost 5·A_FP, rows 12..=19 cost A_FP·Σ_{k=1..8} −S(k/3) =
// A_FP · 7.59685185644849. standard: 1 − 0.55 − 0.83565370420933 = −0.38565370420933 (> −1);
// reward_low_FP: 1 − 1.1 − 1.67130740841867 = −1.77130740841867, so −1; reward_low_FN: −0.38565370420933.
// Normalised: standard 100·(0.74698944411078 + 0.38565370420933)/(1 + 0.38565370420933) = 81.74070800513667;
// reward_low_FP 100·1.52698980042150/2 = 76.34949002107476; reward_low_FN 81.74070800513667.
#[test]
fn hand_computed_tiny_file() {
    let f = tiny_file();
    let s = tiny_scores();
    let expect = [
        (STANDARD, 0.746_989_444_110_777_8, -0.385_653_704_209_333_5, 81.740_708_005_136_67),
        (REWARD_LOW_FP, 0.526_989_800_421_495, -1.0, 76.349_490_021_074_76),
        (REWARD_LOW_FN, 0.746_989_444_110_777_8, -0.385_653_704_209_333_5, 81.740_708_005_136_67),
    ];
    for (profile, raw, null, norm) in expect {
        let r = score::score_corpus(&[input(&f, &s)], &profile).unwrap();
        assert_eq!(r.threshold, 1.0, "{}", profile.name);
        assert!((r.raw - raw).abs() < 1e-12, "{}: raw {} vs {raw}", profile.name, r.raw);
        assert!((r.null - null).abs() < 1e-12, "{}: null {} vs {null}", profile.name, r.null);
        assert_eq!(r.perfect, 1.0);
        assert!((r.normalized - norm).abs() < 1e-9, "{}: {} vs {norm}", profile.name, r.normalized);
        let file = &r.files[0];
        // Rows 3..20 are scored: 4 in the window, 13 outside. At threshold 1.0: rows 9, 10 (TP), 5, 19 (FP).
        assert_eq!((file.tp, file.fp, file.fn_, file.tn), (2, 2, 2, 11));
        assert_eq!((file.windows, file.windows_detected), (1, 1));
    }
}

#[test]
fn sweep_rows_are_weighted_like_nab() {
    let f = tiny_file();
    let mut pts = Vec::new();
    let n = score::sweep_file(&f.timestamps, &f.windows, &tiny_scores(), &STANDARD, 7, &mut pts).unwrap();
    assert_eq!(n, 1);
    assert_eq!(pts.len(), 17, "3 probationary rows dropped");
    // Row 8, the left edge, earns exactly A_TP; row 11, the right edge, S(−1/4)/maxTP.
    assert!((pts[8 - 3].sweep - 1.0).abs() < 1e-15);
    assert_eq!(pts[8 - 3].window, Some(7));
    assert!((pts[11 - 3].sweep - score::scaled_sigmoid(-0.25) / score::scaled_sigmoid(-1.0)).abs() < 1e-15);
    // Row 12, just after the window: y = 1/3; row 3, before it: −A_FP.
    assert!((pts[12 - 3].sweep - 0.11 * score::scaled_sigmoid(1.0 / 3.0)).abs() < 1e-15);
    assert_eq!(pts[0].sweep, -0.11);
    assert_eq!(pts[12 - 3].window, None);
}

#[test]
fn null_and_perfect_detectors_score_0_and_100() {
    let f = tiny_file();
    let null = vec![0.5; 20];
    let mut perfect = vec![0.0; 20];
    perfect[8] = 1.0;
    for p in PROFILES {
        let n = score::score_corpus(&[input(&f, &null)], &p).unwrap();
        assert!(n.normalized.abs() < 1e-12, "{}: null {}", p.name, n.normalized);
        let r = score::score_corpus(&[input(&f, &perfect)], &p).unwrap();
        assert!((r.normalized - 100.0).abs() < 1e-12, "{}: perfect {}", p.name, r.normalized);
    }
}

/// Brute force: NAB's rules read directly, for one threshold, windows as row ranges.
fn brute_file(ts_rows: usize, windows: &[(usize, usize)], scores: &[f64], th: f64, p: &score::Profile) -> f64 {
    let prob = score::probationary_length(ts_rows);
    let s = |y: f64| score::scaled_sigmoid(y);
    let mut total = 0.0;
    for &(l, r) in windows {
        let width = (r - l + 1) as f64;
        let scorable: Vec<usize> = (l..=r).filter(|&i| i as f64 >= prob).collect();
        if scorable.is_empty() {
            continue;
        }
        match scorable.iter().find(|&&i| scores[i] >= th) {
            Some(&i) => total += s(-((r - i + 1) as f64) / width) * p.tp_weight / s(-1.0),
            None => total -= p.fn_weight,
        }
    }
    for (i, &score) in scores.iter().enumerate().take(ts_rows) {
        if (i as f64) < prob || score < th || windows.iter().any(|&(l, r)| (l..=r).contains(&i)) {
            continue;
        }
        let prev = windows.iter().filter(|&&(_, r)| r < i).max_by_key(|&&(_, r)| r);
        total += p.fp_weight
            * match prev {
                None => -1.0,
                Some(&(l, r)) => s((i - r) as f64 / ((r - l) as f64)),
            };
    }
    total
}

fn arb_file() -> impl Strategy<Value = (usize, Vec<(usize, usize)>, Vec<f64>)> {
    (10usize..80).prop_flat_map(|n| {
        let cuts = proptest::collection::btree_set(0..n, 0..6);
        let scores = proptest::collection::vec(prop_oneof![Just(0.0), Just(0.25), Just(0.5), Just(1.0), 0.0..1.0], n);
        (Just(n), cuts, scores).prop_map(|(n, cuts, scores)| {
            // Pairs of cut points become disjoint windows of at least two rows.
            let c: Vec<usize> = cuts.into_iter().collect();
            let w = c.chunks(2).filter(|p| p.len() == 2 && p[1] > p[0]).map(|p| (p[0], p[1])).collect();
            (n, w, scores)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn corpus_score_equals_brute_force_optimum(files in proptest::collection::vec(arb_file(), 1..4)) {
        let owned: Vec<NabFile> = files.iter().enumerate().map(|(k, (n, w, _))| NabFile {
            name: format!("f{k}.csv"),
            timestamps: (0..*n as u64).map(|i| i * MIN).collect(),
            values: vec![0.0; *n],
            windows: w.iter().map(|&(l, r)| (l as u64 * MIN, r as u64 * MIN)).collect(),
        }).collect();
        let inputs: Vec<FileInput<'_>> = owned.iter().zip(&files).map(|(f, (_, _, s))| input(f, s)).collect();
        for p in PROFILES {
            let r = score::score_corpus(&inputs, &p).unwrap();
            let mut cands: Vec<f64> = files.iter().flat_map(|(_, _, s)| s.iter().copied()).collect();
            cands.push(1.1);
            let total = |th: f64| files.iter().map(|(n, w, s)| brute_file(*n, w, s, th, &p)).sum::<f64>();
            let best = cands.iter().map(|&t| total(t)).fold(f64::NEG_INFINITY, f64::max);
            prop_assert!((r.raw - best).abs() < 1e-9, "{}: raw {} vs brute {}", p.name, r.raw, best);
            prop_assert!((total(r.threshold) - r.raw).abs() < 1e-9);
            let per_file: f64 = r.files.iter().map(|f| f.score).sum();
            prop_assert!((per_file - r.raw).abs() < 1e-9);
        }
    }
}

fn real_corpus() -> Option<NabCorpus> {
    let dir = nab_dir();
    if !dir.join(data::WINDOWS_FILE).exists() {
        eprintln!("NAB data not found at {} (set NAB_DIR); skipped", dir.display());
        return None;
    }
    Some(data::load_corpus(&dir).unwrap())
}

#[test]
fn real_corpus_loads_with_every_window() {
    let Some(c) = real_corpus() else { return };
    assert_eq!(c.files.len(), 58);
    assert_eq!(c.rows(), 365_558);
    let text = std::fs::read_to_string(nab_dir().join(data::WINDOWS_FILE)).unwrap();
    let raw: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    let listed: usize = raw.values().map(|v| v.as_array().unwrap().len()).sum();
    assert_eq!(listed, 116);
    assert_eq!(c.windows(), listed);
    // Every window limit is a row's timestamp; together they cover 33,495 rows (docs/eval-nab.md).
    let covered: usize = c
        .files
        .iter()
        .map(|f| {
            let rows = f.window_rows();
            assert_eq!(rows.len(), f.windows.len(), "{}", f.name);
            rows.iter().map(|(l, r)| r - l + 1).sum::<usize>()
        })
        .sum();
    assert_eq!(covered, 33_495);
    let taxi = c.files.iter().find(|f| f.name == "realKnownCause/nyc_taxi.csv").unwrap();
    assert_eq!((taxi.len(), taxi.windows.len(), taxi.step_ns()), (10_320, 5, 1800 * 1_000_000_000));
}

#[test]
fn real_corpus_null_and_perfect_match_nab_results() {
    let Some(c) = real_corpus() else { return };
    let null: Vec<Vec<f64>> = c.files.iter().map(|f| vec![0.5; f.len()]).collect();
    let perfect: Vec<Vec<f64>> = c
        .files
        .iter()
        .map(|f| {
            let mut s = vec![0.0; f.len()];
            for (l, _) in f.window_rows() {
                s[l] = 1.0;
            }
            s
        })
        .collect();
    let n = score_runs("null", &c, &null).unwrap();
    let p = score_runs("perfect", &c, &perfect).unwrap();
    // NAB's results/null/*_scores.csv: −116, −116, −232; perfect = 116 windows.
    for (prof, null_raw) in n.iter().zip([-116.0, -116.0, -232.0]) {
        assert_eq!(prof.null, null_raw, "{}", prof.profile);
        assert_eq!(prof.raw, null_raw, "{}", prof.profile);
        assert_eq!(prof.normalized, 0.0);
        assert_eq!(prof.perfect, 116.0);
    }
    for prof in &p {
        assert!((prof.raw - 116.0).abs() < 1e-9, "{}: {}", prof.profile, prof.raw);
        assert!((prof.normalized - 100.0).abs() < 1e-9);
        assert_eq!(prof.files.iter().map(|f| f.windows_detected).sum::<usize>(), 116);
    }
}

fn registry() -> inferwatch_core::registry::Registry {
    let mut r = inferwatch_core::registry::Registry::new();
    inferwatch_processors::register(&mut r);
    r
}

#[test]
fn override_file_processors_keep_their_order() {
    let dir = std::env::temp_dir().join(format!("nab-override-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.yaml");
    std::fs::write(&path, "processors:\n  zscore_skew/b: { metrics: [nab.value], window: 30 }\n  batch: {}\n").unwrap();
    let p = run::override_processors(&path).unwrap();
    assert_eq!(p.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), vec!["zscore_skew/b", "batch"]);
    assert_eq!(p[0].1["window"], 30);
    std::fs::write(&path, "exporters: {}\n").unwrap();
    assert!(run::override_processors(&path).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_detectors_are_refused_with_a_hint() {
    let f = tiny_file();
    let e = run::builtin_processors("nope", &f).unwrap_err().to_string();
    assert!(e.contains("--config"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zscore_skew_runs_through_the_harness_on_a_real_file() {
    let Some(c) = real_corpus() else { return };
    let f = c.files.iter().find(|f| f.name == "artificialWithAnomaly/art_daily_jumpsup.csv").unwrap();
    let procs = run::builtin_processors("zscore_skew", f).unwrap();
    let r = run::run_file(f, &procs, registry()).await.unwrap();
    // One level per point after the 50-point warm-up, each at its own row's timestamp.
    assert_eq!(r.points, f.len() - 50);
    assert_eq!(r.unmatched, 0);
    assert!(r.scores[..50].iter().all(|&s| s == 0.0));
    assert!(r.scores.iter().all(|s| (0.0..=1.0).contains(s)));
    // The jump up starts inside the window: the highest score of the file is there.
    let (l, rr) = f.window_rows()[0];
    let top = (0..r.scores.len()).max_by(|&a, &b| r.scores[a].total_cmp(&r.scores[b])).unwrap();
    assert!((l..=rr).contains(&top), "top score at row {top}, window {l}..={rr}");
    assert!(r.scores[top] > 0.05, "{}", r.scores[top]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs the whole corpus (365k rows); run with --ignored (NAB_DETECTOR picks the detector)"]
async fn whole_corpus_with_zscore_skew() {
    let dir = nab_dir();
    let detector = std::env::var("NAB_DETECTOR").unwrap_or_else(|_| "zscore_skew".into());
    let report = inferwatch_eval::nab::run_nab(Path::new(&dir), &detector, None, registry(), &|_, _| {}).await.unwrap();
    report.print_table();
    println!("elapsed {:.1} s, level points {}", report.elapsed_s, report.level_points);
    assert_eq!(report.files, 58);
    let std = report.normalized("standard").unwrap();
    assert!((0.0..100.0).contains(&std), "{std}");
}

// ---- the windowed detectors (lstm_ae, pca) ----------------------------------------------------

fn ml_registry() -> inferwatch_core::registry::Registry {
    let mut r = registry();
    inferwatch_ml::register(&mut r);
    r
}

/// True when ONNX Runtime is found as the processor finds it; else prints SKIP (fails when
/// INFERWATCH_REQUIRE_ORT=1).
fn ort_available() -> bool {
    use inferwatch_ml::runtime::{Runtime, Search};
    match Runtime::load(&Search::from_process(None)) {
        Ok(_) => true,
        Err(e) if std::env::var("INFERWATCH_REQUIRE_ORT").as_deref() == Ok("1") => {
            panic!("INFERWATCH_REQUIRE_ORT=1 but {e}")
        }
        Err(e) => {
            println!("SKIP: no ONNX Runtime: {e}");
            false
        }
    }
}

fn hourly(mut f: NabFile) -> NabFile {
    f.timestamps.iter_mut().for_each(|t| *t *= 60);
    f.windows.iter_mut().for_each(|(a, b)| (*a, *b) = (*a * 60, *b * 60));
    f
}

#[test]
fn ml_rows_use_the_nab_models_at_the_files_step() {
    for (d, model) in [("lstm_ae", run::LSTM_AE_MODEL), ("pca", run::PCA_MODEL)] {
        let p = run::builtin_processors(d, &tiny_file()).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0, d);
        let path = PathBuf::from(p[0].1["model"].as_str().unwrap());
        assert!(path.ends_with(model) && path.is_file(), "{}", path.display());
        assert_eq!(p[0].1["step"], "60s");
        assert_eq!(p[0].1["level"]["critical_error"], run::NAB_CRITICAL_ERROR);
        assert_eq!(run::builtin_processors(d, &hourly(tiny_file())).unwrap()[0].1["step"], "3600s");
        assert!(run::is_windowed(&p));
    }
    let z = run::builtin_processors("zscore_skew", &tiny_file()).unwrap();
    assert!(!run::is_windowed(&z));
    assert!(run::is_windowed(&[("pca/nab".into(), serde_json::Value::Null)]));
    // The committed cards are univariate z-value cards (mean 0, std 1) for the runner's gauge.
    for card in [run::LSTM_AE_MODEL.replace(".onnx", ".json"), run::PCA_MODEL.into()] {
        let c = inferwatch_ml::card::Card::load(&run::repo_file(&card)).unwrap();
        assert_eq!(
            (c.signals.as_slice(), c.mean.as_slice(), c.std.as_slice()),
            (&[run::METRIC.to_string()][..], &[0.0][..], &[1.0][..])
        );
        assert_eq!(c.t, 12);
    }
}

#[test]
fn standardised_uses_the_probationary_rows_only() {
    // 20 rows: probation floor(0.15·20) = 3 rows (1, 2, 3): mean 2, population std sqrt(2/3).
    let mut f = tiny_file();
    f.values = (0..20).map(|i| if i < 3 { f64::from(i + 1) } else { 100.0 }).collect();
    let (mean, std) = run::probationary_stats(&f);
    assert!((mean - 2.0).abs() < 1e-12 && (std - (2.0f64 / 3.0).sqrt()).abs() < 1e-12, "{mean} {std}");
    let z = run::standardised(&f);
    assert_eq!(z.timestamps, f.timestamps);
    assert!((z.values[0] + 1.0 / std).abs() < 1e-12);
    assert!((z.values[19] - 98.0 / std).abs() < 1e-9);
    // A constant probation is floored, not divided by zero.
    f.values = vec![5.0; 20];
    assert_eq!(run::probationary_stats(&f), (5.0, run::STD_FLOOR));
}

#[test]
fn window_levels_score_the_last_row_of_their_bucket() {
    use inferwatch_eval::harness::Point;
    let f = tiny_file();
    let at = |t: u64, v: f64| Point { time_ns: t, value: v, attrs: Default::default() };
    // A window ending at bucket 5 is emitted at (5 + 1)·step − 1: row 5, not row 6.
    let pts = [at(6 * MIN - 1, 0.7), at(2 * MIN, 0.4), at(20 * MIN, 0.9)];
    let (before, n) = run::row_scores_aligned(&f, &pts, run::Align::AtOrBefore);
    assert_eq!(n, 2);
    assert_eq!((before[5], before[6], before[2], before[19]), (0.7, 0.0, 0.4, 0.9));
    let (after, _) = run::row_scores_aligned(&f, &pts, run::Align::AtOrAfter);
    assert_eq!((after[5], after[6], after[2]), (0.0, 0.7, 0.4));
    assert_eq!(after.iter().filter(|&&s| s > 0.0).count(), 2); // the point after the last row has no row
}

/// Runs `detector`'s built-in row over one real file; checks the level points against its windows.
async fn windowed_run(detector: &str, name: &str) -> Option<(NabFile, run::FileRun)> {
    let c = real_corpus()?;
    let f = c.files.iter().find(|f| f.name == name).unwrap().clone();
    let procs = run::builtin_processors(detector, &f).unwrap();
    let r = run::run_file(&f, &procs, ml_registry()).await.unwrap();
    // Every level is at a bucket end (no row's timestamp) and lands on a distinct row.
    assert_eq!(r.unmatched, r.points);
    assert_eq!(r.scores.iter().filter(|&&s| s > 0.0).count(), r.points);
    // No window before T = 12 buckets.
    assert!(r.scores[..11].iter().all(|&s| s == 0.0));
    Some((f, r))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pca_runs_on_an_hourly_file_at_its_own_step() {
    // Hourly rows: at the card's 300 s step every bucket would be followed by gaps and no window
    // would ever form; the `step` override makes one window per row after 12 consecutive hours.
    let Some((f, r)) = windowed_run("pca", "realKnownCause/ambient_temperature_system_failure.csv").await else {
        return;
    };
    assert_eq!(f.step_ns(), 3_600_000_000_000);
    assert!(r.points > f.len() * 9 / 10, "{} points for {} rows", r.points, f.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lstm_ae_scores_every_window_of_a_regular_file_and_finds_the_jump() {
    if !ort_available() {
        return;
    }
    let Some((f, r)) = windowed_run("lstm_ae", "artificialWithAnomaly/art_daily_jumpsup.csv").await else {
        return;
    };
    // 4032 regular 5-minute rows: a window at every row from the 12th.
    assert_eq!(r.points, f.len() - 11);
    let (l, rr) = f.window_rows()[0];
    let top = (0..r.scores.len()).max_by(|&a, &b| r.scores[a].total_cmp(&r.scores[b])).unwrap();
    assert!((l..=rr).contains(&top), "top score at row {top}, window {l}..={rr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs the whole corpus through lstm_ae or pca; run with --ignored (NAB_DETECTOR: lstm_ae or pca)"]
async fn whole_corpus_with_ml_detectors() {
    let detector = std::env::var("NAB_DETECTOR").unwrap_or_else(|_| "lstm_ae".into());
    let report = inferwatch_eval::nab::run_nab(&nab_dir(), &detector, None, ml_registry(), &|_, _| {}).await.unwrap();
    report.print_table();
    println!("elapsed {:.1} s, level points {}", report.elapsed_s, report.level_points);
    assert_eq!(report.files, 58);
    assert!(report.level_points > 300_000, "{}", report.level_points);
}

//! The Rust side against the training side's fixtures: feature windows from the same Parquet,
//! and ONNX Runtime's output against the training stack's forward pass.

use crate::common;

use common::{fixture, parquet_batches, runtime_or_skip};
use inferwatch_ml::card::Card;
use inferwatch_ml::features::{GroupKey, Window, windows_from_batches};
use inferwatch_ml::windows::{ExecutionProvider, Scorer};
use serde_json::Value;

fn rows(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|c| c.as_f64().unwrap())).collect()
}

#[test]
fn features_equal_the_training_side_windows() {
    let card = Card::load(&fixture("card.json")).unwrap();
    let got = windows_from_batches(&parquet_batches(), &card).unwrap();
    let want: Value = serde_json::from_str(&std::fs::read_to_string(fixture("windows.json")).unwrap()).unwrap();
    let want = want["windows"].as_array().unwrap();
    assert!(want.len() > 100, "fixture has {} windows", want.len());
    let key = |w: &Value| {
        let g: Vec<String> = w["group"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
        (GroupKey::new(&g[0], &g[1], &g[2]), w["end_bucket"].as_u64().unwrap())
    };
    let mut want: Vec<&Value> = want.iter().collect();
    want.sort_by_key(|w| key(w));
    let got_keys: Vec<(GroupKey, u64)> = got.iter().map(|w| (w.group.clone(), w.end_bucket)).collect();
    let want_keys: Vec<(GroupKey, u64)> = want.iter().map(|w| key(w)).collect();
    assert_eq!(got_keys, want_keys);
    let mut worst = 0f64;
    for (g, w) in got.iter().zip(&want) {
        let (x, m) = (rows(&w["x"]), rows(&w["mask"]));
        assert_eq!(g.mask.iter().map(|v| f64::from(*v)).collect::<Vec<_>>(), m, "mask of {:?}", key(w));
        for (a, b) in g.x.iter().zip(&x) {
            worst = worst.max((f64::from(*a) - b).abs());
        }
    }
    assert!(worst <= 1e-6, "largest difference {worst}");
    // The fixture exercises what it claims: missing cells and the model-less GPU group.
    assert!(got.iter().any(|w| w.missing() > 0));
    assert!(got.iter().any(|w| w.group.model.is_empty()));
}

#[test]
fn onnx_runtime_equals_the_training_forward_pass() {
    let Some(search) = runtime_or_skip("onnx_runtime_equals_the_training_forward_pass") else { return };
    let f: Value = serde_json::from_str(&std::fs::read_to_string(fixture("forward.json")).unwrap()).unwrap();
    let model = fixture(f["model"].as_str().unwrap());
    let mut scorer = Scorer::lstm_ae(&model, &search, ExecutionProvider::Cpu).unwrap();
    let (t, k) = (scorer.card.t, scorer.card.k());
    let inputs = f["input"].as_array().unwrap();
    let n = inputs.len();
    let x: Vec<f32> = inputs.iter().flat_map(rows).map(|v| v as f32).collect();
    let mask: Vec<f32> = f["mask"].as_array().unwrap().iter().flat_map(rows).map(|v| v as f32).collect();
    let want: Vec<f64> = f["output"].as_array().unwrap().iter().flat_map(rows).collect();
    assert_eq!(x.len(), n * t * k);
    let out = scorer.reconstruct(&x, n).unwrap();
    let worst = out.iter().zip(&want).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0f64, f64::max);
    assert!(worst <= 1e-5, "largest difference {worst}");
    // Scores and levels of the same windows.
    let windows: Vec<Window> = (0..n)
        .map(|i| Window {
            group: GroupKey::new("i", "v", "m"),
            end_bucket: i as u64,
            end_ns: 0,
            x: x[i * t * k..(i + 1) * t * k].to_vec(),
            mask: mask[i * t * k..(i + 1) * t * k].to_vec(),
        })
        .collect();
    let scored = scorer.score(&windows).unwrap();
    for (i, (s, level)) in scored.iter().enumerate() {
        let (ws, wl) = (f["score"][i].as_f64().unwrap(), f["level"][i].as_f64().unwrap());
        assert!((s.error - ws).abs() <= 1e-5 * ws.max(1.0), "score {i}: {} vs {ws}", s.error);
        assert!((level - wl).abs() <= 1e-5, "level {i}: {level} vs {wl}");
    }
}

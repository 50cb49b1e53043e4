//! The `lstm_ae` and `pca` processors through the Arrow processor contract: the missing-runtime
//! paths, batching across groups, the output, snapshot / restore.

use crate::common;

use arrow_array::RecordBatch;
use common::{fixture, model, parquet_batches, runtime_or_skip};
use inferwatch_core::arrow::{ArrowProcessor, ArrowProcessorFactory, metrics};
use inferwatch_core::component::{ComponentId, CreateContext};
use inferwatch_core::pdata::Signal;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_ml::card::Card;
use inferwatch_ml::detector::{Detector, Parts};
use inferwatch_ml::features::{Limits, windows_from_batches};
use inferwatch_ml::lstm_ae::{self, LstmAeConfig, LstmAeFactory, OnMissingRuntime};
use inferwatch_ml::pca::{Pca, PcaConfig};
use inferwatch_ml::runtime::Search;
use inferwatch_ml::windows::{ExecutionProvider, Scorer};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AV;
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point};
use std::path::PathBuf;
use std::sync::Arc;

fn ctx(name: &str) -> CreateContext {
    CreateContext::new(ComponentId::parse(name).unwrap(), Arc::new(Telemetry::new()))
}

/// (metric name, time, model, version, instance, value, evidence) of every output point, sorted.
type Point = (String, u64, String, String, String, f64, Vec<(String, String)>);

fn points(batches: &[RecordBatch]) -> Vec<Point> {
    let mut out = Vec::new();
    for b in batches {
        for rm in metrics::from_batch(b).unwrap().resource_metrics {
            for sm in rm.scope_metrics {
                for m in sm.metrics {
                    let Some(Data::Gauge(g)) = m.data else { panic!("gauge") };
                    for p in g.data_points {
                        let attr = |k: &str| {
                            p.attributes
                                .iter()
                                .find(|kv| kv.key == k)
                                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                                    AV::StringValue(s) => Some(s.clone()),
                                    AV::IntValue(i) => Some(i.to_string()),
                                    AV::DoubleValue(d) => Some(format!("{d:.9}")),
                                    _ => None,
                                })
                                .unwrap_or_default()
                        };
                        let Some(number_data_point::Value::AsDouble(v)) = p.value else { panic!("double") };
                        let ev = p
                            .attributes
                            .iter()
                            .filter(|kv| {
                                kv.key.contains('.') && kv.key.split('.').next() == Some(attr("detector").as_str())
                            })
                            .map(|kv| (kv.key.clone(), attr(&kv.key)))
                            .collect();
                        out.push((
                            m.name.clone(),
                            p.time_unix_nano,
                            attr("gen_ai.request.model"),
                            attr("service.version"),
                            attr("service.instance.id"),
                            v,
                            ev,
                        ));
                    }
                }
            }
        }
    }
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    out
}

fn run(p: &mut dyn ArrowProcessor, batches: &[RecordBatch], watermark: u64) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    for b in batches {
        p.process(b, &mut out).unwrap();
    }
    p.advance(watermark, &mut out).unwrap();
    out
}

fn tiny_config(runtime_library: Option<PathBuf>, on_missing: OnMissingRuntime, max_batch: usize) -> LstmAeConfig {
    LstmAeConfig {
        model: fixture("tiny.onnx"),
        runtime_library,
        on_missing_runtime: on_missing,
        max_batch,
        ..Default::default()
    }
}

fn no_runtime_search(missing: &str) -> Search {
    Search { configured: Some(PathBuf::from(missing)), cwd: std::env::current_dir().ok(), ..Default::default() }
}

#[test]
fn missing_runtime_fails_with_one_clear_error() {
    let missing = "/nonexistent/onnxruntime/libonnxruntime.so.1.31.1";
    let cfg = tiny_config(Some(missing.into()), OnMissingRuntime::Fail, 256);
    let Err(e) = lstm_ae::create(&ctx("lstm_ae"), &cfg, &no_runtime_search(missing)) else {
        panic!("created without a runtime")
    };
    let msg = e.to_string();
    assert!(msg.starts_with("lstm_ae: ONNX Runtime not found"), "{msg}");
    assert!(msg.contains(&format!("runtime_library = {missing} (no such file)")), "{msg}");
    assert!(msg.contains("./scripts/test.sh") && msg.contains("ORT_DYLIB_PATH"), "{msg}");
    // Through the factory too, when the environment does not name a library.
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        let json = serde_json::json!({ "model": fixture("tiny.onnx"), "runtime_library": missing });
        let Err(e) = LstmAeFactory.create_arrow(ctx("lstm_ae/x"), &json, Signal::Metrics) else { panic!("created") };
        assert!(e.to_string().contains("ONNX Runtime not found"), "{e}");
    }
}

#[test]
fn missing_runtime_with_disable_passes_through() {
    let missing = "/nonexistent/libonnxruntime.so.1.31.1";
    let cfg = tiny_config(Some(missing.into()), OnMissingRuntime::Disable, 256);
    let mut p = lstm_ae::create(&ctx("lstm_ae"), &cfg, &no_runtime_search(missing)).unwrap();
    let out = run(p.as_mut(), &parquet_batches(), u64::MAX);
    assert!(out.is_empty());
    assert_eq!(p.series_count(), 0);
    // A bad model fails even with `disable` (it is not a runtime problem).
    let bad = LstmAeConfig { model: PathBuf::from("/nonexistent/m.onnx"), ..cfg };
    let Err(e) = lstm_ae::create(&ctx("lstm_ae"), &bad, &no_runtime_search(missing)) else { panic!("created") };
    assert!(e.to_string().contains("cannot read model card /nonexistent/m.json"), "{e}");
}

#[test]
fn windows_of_all_groups_in_one_run_score_as_one_by_one() {
    let Some(search) = runtime_or_skip("windows_of_all_groups_in_one_run_score_as_one_by_one") else { return };
    let card = Card::load(&fixture("tiny.json")).unwrap();
    let windows = windows_from_batches(&parquet_batches(), &card).unwrap();
    let groups: std::collections::BTreeSet<_> = windows.iter().map(|w| w.group.clone()).collect();
    assert!(groups.len() >= 2 && windows.len() > 50, "{} windows of {} groups", windows.len(), groups.len());
    let mut batched = Scorer::lstm_ae(&fixture("tiny.onnx"), &search, ExecutionProvider::Cpu).unwrap();
    let mut single = Scorer::lstm_ae(&fixture("tiny.onnx"), &search, ExecutionProvider::Cpu).unwrap().with_max_batch(1);
    let a = batched.score(&windows).unwrap();
    let b = single.score(&windows).unwrap();
    for ((sa, la), (sb, lb)) in a.iter().zip(&b) {
        assert!((sa.error - sb.error).abs() <= 1e-6 * sb.error.max(1.0), "{} vs {}", sa.error, sb.error);
        assert!((la - lb).abs() <= 1e-6);
        assert_eq!((sa.top_signal, sa.missing), (sb.top_signal, sb.missing));
    }
    assert!(a.iter().any(|(s, _)| s.error > 0.0));

    // The processor emits one score and one level per window, at the bucket end, with evidence.
    let mut p = lstm_ae::create(&ctx("lstm_ae"), &tiny_config(None, OnMissingRuntime::Fail, 256), &search).unwrap();
    let pts = points(&run(p.as_mut(), &parquet_batches(), u64::MAX));
    let scores: Vec<&Point> = pts.iter().filter(|p| p.0 == "llm.anomaly.score").collect();
    assert_eq!(scores.len(), windows.len());
    assert_eq!(pts.len(), 2 * windows.len());
    for w in &windows {
        let s = scores
            .iter()
            .find(|p| p.1 == w.end_ns && p.2 == w.group.model && p.4 == w.group.instance)
            .unwrap_or_else(|| panic!("no score for {:?} at {}", w.group, w.end_bucket));
        let i = windows.iter().position(|x| x == w).unwrap();
        assert!((s.5 - a[i].0.error).abs() <= 1e-6 * a[i].0.error.max(1.0));
        let ev: Vec<&str> = s.6.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(ev, vec!["lstm_ae.error", "lstm_ae.top_signal", "lstm_ae.missing"]);
        assert_eq!(s.6[1].1, card.signals[a[i].0.top_signal]);
        assert_eq!(s.6[2].1, w.missing().to_string());
    }
}

/// A PCA detector on the fixture card (no runtime needed): one component along the first cell.
fn pca_detector(max_batch: usize) -> Detector {
    let card = Card::load(&fixture("card.json")).unwrap();
    let d = card.t * card.k();
    let mut comp = vec![0.0; d];
    comp[0] = 1.0;
    let m = inferwatch_ml::card::PcaModel { center: vec![0.1; d], components: vec![comp] };
    let levels = card.levels(None, None).unwrap();
    Detector::new(
        &ctx("pca"),
        Parts {
            detector: "pca",
            card,
            levels,
            model: Box::new(Pca::new(&m)),
            limits: Limits { max_series: 100, idle_ns: u64::MAX },
            max_batch,
            lateness_ns: 0,
        },
    )
}

#[test]
fn snapshot_and_restore_continue_identically() {
    let batches = parquet_batches();
    let half = batches.len() / 2;
    assert!(half >= 1);
    let max_t = |bs: &[RecordBatch]| {
        bs.iter()
            .map(|b| inferwatch_core::arrow::time_column(b).unwrap().iter().flatten().max().unwrap() as u64)
            .max()
            .unwrap()
    };
    let wm = max_t(&batches[..half]) - 120_000_000_000;
    let mut a = pca_detector(256);
    let first = run(&mut a, &batches[..half], wm);
    assert!(!first.is_empty());
    let snap = a.snapshot().unwrap();
    let mut b = pca_detector(256);
    b.restore(&snap).unwrap();
    assert_eq!(b.snapshot().unwrap(), snap);
    assert_eq!(b.series_count(), a.series_count());
    let rest_a = points(&run(&mut a, &batches[half..], u64::MAX));
    let rest_b = points(&run(&mut b, &batches[half..], u64::MAX));
    assert!(!rest_a.is_empty());
    assert_eq!(rest_a, rest_b);
    // And together they equal one uninterrupted run.
    let mut whole = pca_detector(7);
    let mut all = points(&run(&mut whole, &batches[..half], wm));
    all.extend(points(&run(&mut whole, &batches[half..], u64::MAX)));
    all.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let mut split = points(&first);
    split.extend(rest_a);
    split.sort_by(|x, y| x.partial_cmp(y).unwrap());
    assert_eq!(all, split);
    assert!(whole.model_runs() > a.model_runs());
    assert!(b.restore(&snap[..snap.len() / 2]).is_err());
}

#[test]
fn committed_models_load() {
    let mut p =
        inferwatch_ml::pca::create(&ctx("pca"), &PcaConfig { model: model("pca_default.json"), ..Default::default() })
            .unwrap();
    let _ = run(&mut p, &parquet_batches(), u64::MAX);
    assert!(p.series_count() >= 2);
    let Some(search) = runtime_or_skip("committed_models_load") else { return };
    let cfg = LstmAeConfig { model: model("lstm_ae_default.onnx"), ..Default::default() };
    let mut p = lstm_ae::create(&ctx("lstm_ae"), &cfg, &search).unwrap();
    let out = points(&run(p.as_mut(), &parquet_batches(), u64::MAX));
    // T = 60 one-minute steps: the fixture's longest run gives windows.
    assert!(out.iter().any(|p| p.0 == "llm.anomaly.level" && (0.0..=1.0).contains(&p.5)), "{out:?}");
}

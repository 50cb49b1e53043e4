//! Factories parse a component's settings once, into their typed config: validation keeps
//! what each factory parsed and the graph builds every pipeline's instance from it.

use async_trait::async_trait;
use inferwatch_core::component::{
    ComponentError, CreateContext, ExporterFactory, FieldError, Node, NodeRef, Parsed, ProcessorFactory, Receiver,
    ReceiverConsumers, ReceiverFactory, parse_config, typed,
};
use inferwatch_core::config::{self, load_str};
use inferwatch_core::consumer::{ConsumeError, Consumer, ConsumerRef};
use inferwatch_core::graph::Service;
use inferwatch_core::registry::Registry;
use inferwatch_core::telemetry::Telemetry;
use inferwatch_core::{Payload, Signal};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The typed settings of every counting factory.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    level: u32,
}

/// Counts `parse` and `build` calls; records the `level` each build got.
#[derive(Default)]
struct Counting {
    parses: AtomicUsize,
    builds: AtomicUsize,
    levels: parking_lot::Mutex<Vec<u32>>,
}

impl Counting {
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        self.parses.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(parse_config::<Settings>(cfg)?))
    }
    fn build(&self, p: &Parsed) -> Result<(), ComponentError> {
        self.builds.fetch_add(1, Ordering::SeqCst);
        self.levels.lock().push(typed::<Settings>(p)?.level);
        Ok(())
    }
}

struct Rx(Arc<Counting>);
struct Proc(Arc<Counting>);
struct Exp(Arc<Counting>);

const ALL: &[Signal] = &[Signal::Traces, Signal::Metrics, Signal::Logs];

struct Idle;

#[async_trait]
impl Receiver for Idle {
    async fn start(&mut self, _: ReceiverConsumers) -> Result<(), ComponentError> {
        Ok(())
    }
    async fn shutdown(&mut self) {}
}

/// Passes data on to `next` (or drops it when there is none).
struct Pass(Option<ConsumerRef>);

#[async_trait]
impl Consumer for Pass {
    async fn consume(&self, data: Payload) -> Result<(), ConsumeError> {
        match &self.0 {
            Some(n) => n.consume(data).await,
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Node for Pass {
    async fn shutdown(&self, _: Instant) -> u64 {
        0
    }
}

impl ReceiverFactory for Rx {
    fn type_name(&self) -> &'static str {
        "rx"
    }
    fn signals(&self) -> &'static [Signal] {
        ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        self.0.parse(cfg)
    }
    fn build(&self, _: CreateContext, p: &Parsed) -> Result<Box<dyn Receiver>, ComponentError> {
        self.0.build(p)?;
        Ok(Box::new(Idle))
    }
}

impl ProcessorFactory for Proc {
    fn type_name(&self) -> &'static str {
        "proc"
    }
    fn signals(&self) -> &'static [Signal] {
        ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        self.0.parse(cfg)
    }
    fn build(&self, _: CreateContext, p: &Parsed, _: Signal, next: ConsumerRef) -> Result<NodeRef, ComponentError> {
        self.0.build(p)?;
        Ok(Arc::new(Pass(Some(next))))
    }
}

impl ExporterFactory for Exp {
    fn type_name(&self) -> &'static str {
        "exp"
    }
    fn signals(&self) -> &'static [Signal] {
        ALL
    }
    fn parse(&self, cfg: &serde_json::Value) -> Result<Parsed, FieldError> {
        self.0.parse(cfg)
    }
    fn build(&self, _: CreateContext, p: &Parsed, _: Signal) -> Result<NodeRef, ComponentError> {
        self.0.build(p)?;
        Ok(Arc::new(Pass(None)))
    }
}

const CONFIG: &str = "
receivers:
  rx:
    level: 1
processors:
  proc:
    level: 2
exporters:
  exp:
    level: 3
service:
  pipelines:
    metrics:
      receivers: [rx]
      processors: [proc]
      exporters: [exp]
    metrics/b:
      receivers: [rx]
      processors: [proc]
      exporters: [exp]
    traces:
      receivers: [rx]
      processors: [proc]
      exporters: [exp]
";

fn setup() -> (Registry, [Arc<Counting>; 3]) {
    let (rx, pr, ex) = (Arc::new(Counting::default()), Arc::new(Counting::default()), Arc::new(Counting::default()));
    let mut r = Registry::new();
    r.add_receiver(Arc::new(Rx(rx.clone())));
    r.add_processor(Arc::new(Proc(pr.clone())));
    r.add_exporter(Arc::new(Exp(ex.clone())));
    (r, [rx, pr, ex])
}

fn counts(c: &Counting) -> (usize, usize, Vec<u32>) {
    (c.parses.load(Ordering::SeqCst), c.builds.load(Ordering::SeqCst), c.levels.lock().clone())
}

#[test]
fn settings_used_in_three_pipelines_are_parsed_once() {
    let (registry, [rx, pr, ex]) = setup();
    let cfg = load_str("c.yaml", CONFIG, &|_| None).unwrap();
    assert_eq!(config::validate(&cfg, &registry), vec![]);
    Service::build(&cfg, &registry, Arc::new(Telemetry::new())).unwrap();
    // One receiver instance; one processor per pipeline; one exporter per signal.
    assert_eq!(counts(&rx), (1, 1, vec![1]));
    assert_eq!(counts(&pr), (1, 3, vec![2, 2, 2]));
    assert_eq!(counts(&ex), (1, 2, vec![3, 3]));
}

#[test]
fn building_without_validation_parses_once_too() {
    let (registry, [rx, pr, ex]) = setup();
    let cfg = load_str("c.yaml", CONFIG, &|_| None).unwrap();
    Service::build(&cfg, &registry, Arc::new(Telemetry::new())).unwrap();
    assert_eq!(counts(&rx), (1, 1, vec![1]));
    assert_eq!(counts(&pr), (1, 3, vec![2, 2, 2]));
    assert_eq!(counts(&ex), (1, 2, vec![3, 3]));
}

#[test]
fn changed_settings_are_parsed_again() {
    let (registry, [_, pr, _]) = setup();
    let mut cfg = load_str("c.yaml", CONFIG, &|_| None).unwrap();
    assert_eq!(config::validate(&cfg, &registry), vec![]);
    let proc_id = inferwatch_core::ComponentId::parse("proc").unwrap();
    if let Some(p) = cfg.processors.get_mut(&proc_id) {
        p.settings = serde_json::json!({"level": 7});
    }
    Service::build(&cfg, &registry, Arc::new(Telemetry::new())).unwrap();
    // The settings kept by validation are not those built: parsed again, once.
    assert_eq!(counts(&pr), (2, 3, vec![7, 7, 7]));
}

#[test]
fn validate_and_create_go_through_parse_and_build() {
    let (registry, [_, pr, _]) = setup();
    let f = registry.processor("proc").unwrap();
    assert!(f.validate(&serde_json::json!({"level": 4})).is_ok());
    let e = f.validate(&serde_json::json!({"levle": 4})).unwrap_err();
    assert!(e.message.starts_with("unknown field `levle`"), "{}", e.message);
    assert_eq!(counts(&pr), (2, 0, vec![]));
}

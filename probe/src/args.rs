//! Command-line options of `inferwatch bench` ([`BenchArgs`]), flattened into the binary's
//! subcommand.

use std::path::PathBuf;
use std::time::Duration;

use crate::{Api, ArrivalKind, OtlpProtocol, ProbeKind};

/// Command-line options of `inferwatch bench`.
#[derive(Debug, Clone, clap::Args)]
#[command(about = "Drive an OpenAI-compatible endpoint and measure TTFT, ITL, TPOT, e2e, goodput and quality")]
pub struct BenchArgs {
    /// Base URL of the server (http://host:8000, .../v1, or the full API path).
    #[arg(long)]
    pub endpoint: String,
    /// Model name sent in every request.
    #[arg(long)]
    pub model: String,
    /// Open loop: requests per second.
    #[arg(long, conflicts_with_all = ["concurrency", "flow", "rate_sweep"])]
    pub rate: Option<f64>,
    /// Arrival process of the open loop.
    #[arg(long, value_enum, default_value_t = ArrivalKind::Poisson)]
    pub arrivals: ArrivalKind,
    /// Open loop at each of these rates in turn (e.g. 1,2,4,8), each for --duration / --requests.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["concurrency", "flow"])]
    pub rate_sweep: Option<Vec<f64>>,
    /// Closed loop: this many requests in flight at all times.
    #[arg(long, conflicts_with = "flow")]
    pub concurrency: Option<usize>,
    /// Dialogue flow YAML (`dialogue_flow:`): per-state QPS, multi-turn conversations.
    #[arg(long)]
    pub flow: Option<PathBuf>,
    /// Replay a trace's arrivals and prompt/output lengths (Azure LLM inference CSV, or CSV /
    /// JSONL with timestamp, input_tokens, output_tokens[, session_id]); see probe/README.md.
    #[arg(long, conflicts_with_all = ["rate", "rate_sweep", "concurrency", "flow", "probe", "dataset", "perturb"])]
    pub trace: Option<PathBuf>,
    /// Trace time scale: 10 replays ten times faster.
    #[arg(long, default_value_t = 1.0, requires = "trace")]
    pub trace_speed: f64,
    /// Start the trace again when it ends (needs --duration or --requests).
    #[arg(long, requires = "trace")]
    pub trace_loop: bool,
    /// Replay each request with this probability (seeded by --seed).
    #[arg(long, requires = "trace")]
    pub trace_sample: Option<f64>,
    /// Replay from this far into the trace (trace time, e.g. 10m).
    #[arg(long, value_parser = parse_duration_arg, requires = "trace")]
    pub trace_start: Option<Duration>,
    /// Replay only this much of the trace (trace time, e.g. 10m).
    #[arg(long, value_parser = parse_duration_arg, requires = "trace")]
    pub trace_duration: Option<Duration>,
    /// How prompt lengths are matched to the server's tokenizer: auto (its /tokenize, else the
    /// rule), server, or rule.
    #[arg(long, value_enum, default_value_t = crate::trace::Tokenizer::Auto, requires = "trace")]
    pub trace_tokenizer: crate::trace::Tokenizer,
    /// How long to send (e.g. 60s, 5m, or seconds). Default 60s (the probes have their own).
    #[arg(long, value_parser = parse_duration_arg, conflicts_with = "requests")]
    pub duration: Option<Duration>,
    /// How many requests to send (open loop: arrivals; flows: turns).
    #[arg(long)]
    pub requests: Option<u64>,
    /// JSONL prompts: {"prompt": ..., "reference": ..., "max_tokens": ...} or {"messages": [...]}.
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Send client spans and gen_ai.client.* metrics over OTLP (e.g. http://127.0.0.1:4317).
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: grpc or http/protobuf.
    #[arg(long, value_enum, default_value_t = OtlpProtocol::Grpc)]
    pub otlp_protocol: OtlpProtocol,
    /// How often the OTLP metrics are exported.
    #[arg(long, value_parser = parse_duration_arg, default_value = "10s")]
    pub otlp_interval: Duration,
    /// `service.name` of the OTLP resource.
    #[arg(long, default_value = "inferwatch-bench")]
    pub otlp_service_name: String,
    /// `gen_ai.provider.name` on spans and metrics.
    #[arg(long, default_value = "openai")]
    pub provider_name: String,
    /// Ask for the top K log-probabilities and report the first token's entropy (TLE).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub logprobs: Option<u32>,
    /// max_tokens per request (default 128; the dataset and flow states may override it).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// Length of synthetic prompts in tokens (when no --dataset).
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Stream the answers (the default; needed for TTFT and ITL).
    #[arg(long, overrides_with = "no_stream")]
    pub stream: bool,
    /// Ask for whole answers instead of streams.
    #[arg(long, overrides_with = "stream")]
    pub no_stream: bool,
    /// Do not send stream_options.include_usage (for servers that reject it).
    #[arg(long)]
    pub no_stream_usage: bool,
    /// Which API: chat (/v1/chat/completions), completions (/v1/completions) or tgi (TGI's
    /// /generate_stream, or /generate with --no-stream).
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    pub api: Api,
    /// SLOs for goodput, e.g. ttft=500ms,tpot=50ms,e2e=10s.
    #[arg(long)]
    pub slo: Option<String>,
    /// A study probe: ttft (max_tokens 1), tps (128 tokens), p99-drift (5 min at 50 QPS).
    #[arg(long, value_enum)]
    pub probe: Option<ProbeKind>,
    /// Window of the p99-drift probe.
    #[arg(long, value_parser = parse_duration_arg, default_value = "30s")]
    pub window: Duration,
    /// Reference answers (JSONL) for RCI, keyed by prompt, state or line.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// RCI weights alpha,beta,gamma (beta is dropped without a semantic model).
    #[arg(long, default_value = "0.5,0.3,0.2")]
    pub rci_weights: String,
    /// Perturbation profile: light, medium, heavy, sentences:N or text:TEXT (each prompt is
    /// also sent with distractor text inserted mid-prompt and the two answers compared).
    #[arg(long)]
    pub perturb: Option<String>,
    /// Images per request: each (chat) request carries this many generated PNGs as
    /// `image_url` parts of its last user message (probe/README.md, Images and image masking).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=16))]
    pub images_per_request: u64,
    /// Size of the generated images, WIDTHxHEIGHT.
    #[arg(long, default_value = "448x448")]
    pub image_size: String,
    /// How images travel: base64 (data: URLs in the body) or url (served by the bench).
    #[arg(long, value_enum, default_value_t = crate::images::ImageTransport::Base64)]
    pub image_transport: crate::images::ImageTransport,
    /// Address the image server binds with --image-transport url.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub image_bind: String,
    /// Base URL the model server reaches the image server at (default: http://<bound address>).
    #[arg(long)]
    pub image_base_url: Option<String>,
    /// Image masking (0–0.3): each prompt is also sent with this fraction of every image's
    /// pixels masked (and, with --perturb, with text and masking together); per-type report.
    #[arg(long)]
    pub image_mask_ratio: Option<f64>,
    /// Seed of arrivals, synthetic prompts and distractors.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most requests in flight in open-loop and flow modes; arrivals beyond are counted as overflow.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight: u64,
    /// Flows: start at most this many users (conversations).
    #[arg(long)]
    pub max_users: Option<u64>,
    /// Deadline of one request (flow states may set their own).
    #[arg(long, value_parser = parse_duration_arg, default_value = "300s")]
    pub timeout: Duration,
    /// Retries of a failed request (flow states may set their own).
    #[arg(long, default_value_t = 0)]
    pub max_retries: u32,
    /// `temperature` to send (default: the server's; perturbation runs use 0).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Send `ignore_eos: true` (vLLM) so that every answer has max_tokens tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Bearer token for the server.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Accept any TLS certificate.
    #[arg(long)]
    pub insecure: bool,
    /// No live progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Worker threads of the client runtime (main_entry only; default: all cores).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// A plug-in hook process (JSON lines over stdin/stdout; repeatable, run in order after the
    /// config file's), e.g. `--hook "python3 probe/examples/hooks/system_prompt.py"`.
    #[arg(long = "hook", value_name = "CMD")]
    pub hooks: Vec<String>,
    /// Timeout of one hook call (a hook that misses three in a row is given up on).
    #[arg(long, value_parser = parse_duration_arg, default_value = "5s")]
    pub hook_timeout: Duration,
    /// Bench config YAML: `hooks:` (a list of `{command, name, timeout}`).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

impl BenchArgs {
    /// Options with every default, for `endpoint` and `model` (handy in tests and embedders).
    pub fn new(endpoint: &str, model: &str) -> BenchArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: BenchArgs,
        }
        match P::try_parse_from(["bench", "--endpoint", endpoint, "--model", model]) {
            Ok(p) => p.a,
            // Both flags are plain strings, so parsing cannot fail; fall back to a minimal set.
            Err(_) => BenchArgs::minimal(endpoint, model),
        }
    }

    fn minimal(endpoint: &str, model: &str) -> BenchArgs {
        BenchArgs {
            endpoint: endpoint.into(),
            model: model.into(),
            rate: None,
            arrivals: ArrivalKind::Poisson,
            rate_sweep: None,
            concurrency: None,
            flow: None,
            trace: None,
            trace_speed: 1.0,
            trace_loop: false,
            trace_sample: None,
            trace_start: None,
            trace_duration: None,
            trace_tokenizer: crate::trace::Tokenizer::Auto,
            duration: None,
            requests: None,
            dataset: None,
            json: None,
            otlp_endpoint: None,
            otlp_protocol: OtlpProtocol::Grpc,
            otlp_interval: Duration::from_secs(10),
            otlp_service_name: "inferwatch-bench".into(),
            provider_name: "openai".into(),
            logprobs: None,
            max_tokens: None,
            prompt_tokens: 128,
            stream: false,
            no_stream: false,
            no_stream_usage: false,
            api: Api::Chat,
            slo: None,
            probe: None,
            window: Duration::from_secs(30),
            reference: None,
            rci_weights: "0.5,0.3,0.2".into(),
            perturb: None,
            images_per_request: 0,
            image_size: "448x448".into(),
            image_transport: crate::images::ImageTransport::Base64,
            image_bind: "127.0.0.1:0".into(),
            image_base_url: None,
            image_mask_ratio: None,
            seed: 0,
            max_in_flight: 4096,
            max_users: None,
            timeout: Duration::from_secs(300),
            max_retries: 0,
            temperature: None,
            ignore_eos: false,
            api_key: None,
            insecure: false,
            quiet: false,
            client_threads: None,
            hooks: Vec::new(),
            hook_timeout: Duration::from_secs(5),
            config: None,
        }
    }
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    crate::parse_duration(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        let mut v = vec!["bench", "--endpoint", "http://h:1", "--model", "m"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| c.a)
    }

    #[test]
    fn cli_shapes() {
        let a = parse(&["--rate", "5", "--arrivals", "constant", "--duration", "10s"]).unwrap();
        assert_eq!(a.rate, Some(5.0));
        assert_eq!(a.arrivals, ArrivalKind::Constant);
        assert_eq!(a.duration, Some(Duration::from_secs(10)));
        let a = parse(&["--concurrency", "4", "--requests", "100", "--no-stream", "--api", "completions"]).unwrap();
        assert_eq!((a.concurrency, a.requests, a.no_stream, a.api), (Some(4), Some(100), true, Api::Completions));
        let a = parse(&["--rate-sweep", "1,2,4,8"]).unwrap();
        assert_eq!(a.rate_sweep, Some(vec![1.0, 2.0, 4.0, 8.0]));
        let a = parse(&["--probe", "p99-drift", "--otlp-protocol", "http/protobuf"]).unwrap();
        assert_eq!((a.probe, a.otlp_protocol), (Some(ProbeKind::P99Drift), OtlpProtocol::HttpProtobuf));
        assert!(parse(&["--rate", "1", "--concurrency", "2"]).is_err());
        assert!(parse(&["--rate", "1", "--flow", "f.yaml"]).is_err());
        assert!(parse(&["--duration", "1s", "--requests", "2"]).is_err());
        assert!(parse(&["--logprobs", "0"]).is_err());
        let a = parse(&["--stream", "--no-stream", "--stream"]).unwrap();
        assert!(a.stream && !a.no_stream);
        assert_eq!(BenchArgs::new("http://x", "m").prompt_tokens, 128);
        let a = parse(&["--trace", "t.csv", "--trace-speed", "10", "--trace-loop", "--trace-sample", "0.25"]).unwrap();
        assert_eq!((a.trace_speed, a.trace_loop, a.trace_sample), (10.0, true, Some(0.25)));
        assert!(parse(&["--trace", "t.csv", "--rate", "1"]).is_err());
        assert!(parse(&["--trace-speed", "2"]).is_err());
    }
}

//! Engine configuration: the GPU profile, the model profile and vLLM-like scheduler limits.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// A GPU: nominal hardware figures plus the calibrated effective rates the cost model uses.
///
/// The effective figures are calibrated so that Llama-3-8B FP16 reproduces the study's
/// TTFT / TPS table (scenarios/README.md, Engine calibration); they are not datasheet numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProfile {
    /// Profile name (`a10g`, `l4`, `mi300x` or a custom one).
    pub name: String,
    /// Device memory in GiB.
    pub memory_gib: f64,
    /// Nominal memory bandwidth in GB/s (datasheet).
    pub bandwidth_gbs: f64,
    /// Nominal dense FP16 tensor throughput in TFLOP/s (datasheet).
    pub fp16_tflops: f64,
    /// Calibrated effective memory bandwidth in GB/s used by the cost model.
    pub effective_bandwidth_gbs: f64,
    /// Calibrated effective FP16 throughput in TFLOP/s used by the cost model.
    pub effective_tflops: f64,
    /// Fixed CPU / launch overhead of every engine step, in microseconds.
    pub step_overhead_us: f64,
    /// Memory reserved for activations and the runtime, in GiB (not available to the KV cache).
    pub activation_reserve_gib: f64,
}

impl GpuProfile {
    /// NVIDIA A10G (24 GiB, 600 GB/s, 125 TFLOP/s FP16 dense).
    pub fn a10g() -> Self {
        GpuProfile {
            name: "a10g".into(),
            memory_gib: 24.0,
            bandwidth_gbs: 600.0,
            fp16_tflops: 125.0,
            effective_bandwidth_gbs: 640.0,
            effective_tflops: 80.9,
            step_overhead_us: 1000.0,
            activation_reserve_gib: 1.0,
        }
    }

    /// NVIDIA L4 (24 GiB, 300 GB/s, 121 TFLOP/s FP16 dense).
    pub fn l4() -> Self {
        GpuProfile {
            name: "l4".into(),
            memory_gib: 24.0,
            bandwidth_gbs: 300.0,
            fp16_tflops: 121.0,
            effective_bandwidth_gbs: 360.0,
            effective_tflops: 58.0,
            step_overhead_us: 1000.0,
            activation_reserve_gib: 1.0,
        }
    }

    /// AMD Instinct MI300X (192 GiB, 5300 GB/s, 1307 TFLOP/s FP16 dense).
    pub fn mi300x() -> Self {
        GpuProfile {
            name: "mi300x".into(),
            memory_gib: 192.0,
            bandwidth_gbs: 5300.0,
            fp16_tflops: 1307.0,
            effective_bandwidth_gbs: 1820.0,
            effective_tflops: 97.0,
            step_overhead_us: 13_000.0,
            activation_reserve_gib: 2.0,
        }
    }

    /// The built-in profile with this name, if any.
    pub fn builtin(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "a10g" => Some(Self::a10g()),
            "l4" => Some(Self::l4()),
            "mi300x" => Some(Self::mi300x()),
            _ => None,
        }
    }

    /// Names of the built-in profiles.
    pub const BUILTIN: [&'static str; 3] = ["a10g", "l4", "mi300x"];
}

/// A decoder-only transformer: the figures the cost model and the KV pool need.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelProfile {
    /// Model name (what `--served-model-name` defaults to).
    pub name: String,
    /// Parameter count.
    pub params: f64,
    /// Bytes per weight / KV element (2 for FP16 / BF16).
    pub dtype_bytes: f64,
    /// Transformer layers.
    pub num_layers: u32,
    /// Hidden size.
    pub hidden_size: u32,
    /// Key/value heads (GQA).
    pub num_kv_heads: u32,
    /// Dimension of one attention head.
    pub head_dim: u32,
    /// Vocabulary size (synthetic token ids are drawn below it).
    pub vocab_size: u32,
}

impl ModelProfile {
    /// Meta Llama-3-8B(-Instruct) in FP16.
    pub fn llama3_8b() -> Self {
        ModelProfile {
            name: "meta-llama/Meta-Llama-3-8B-Instruct".into(),
            params: 8.03e9,
            dtype_bytes: 2.0,
            num_layers: 32,
            hidden_size: 4096,
            num_kv_heads: 8,
            head_dim: 128,
            vocab_size: 128_256,
        }
    }

    /// The built-in model with this name (`llama-3-8b`), if any.
    pub fn builtin(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "llama-3-8b" | "llama3-8b" | "meta-llama/meta-llama-3-8b-instruct" => Some(Self::llama3_8b()),
            _ => None,
        }
    }

    /// Weight bytes.
    pub fn weight_bytes(&self) -> f64 {
        self.params * self.dtype_bytes
    }

    /// KV-cache bytes per token (K and V, all layers).
    pub fn kv_bytes_per_token(&self) -> f64 {
        2.0 * f64::from(self.num_layers) * f64::from(self.num_kv_heads) * f64::from(self.head_dim) * self.dtype_bytes
    }
}

/// Deserializes a profile either from a built-in name (`gpu: a10g`) or from a full map.
macro_rules! by_name_or_map {
    ($ty:ident, $what:literal) => {
        impl<'de> Deserialize<'de> for NamedOr<$ty> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = NamedOr<$ty>;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        write!(f, "a built-in {} name or a full profile map", $what)
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                        $ty::builtin(v)
                            .map(NamedOr)
                            .ok_or_else(|| E::custom(format!("unknown built-in {} {v:?}", $what)))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
                        $ty::deserialize(de::value::MapAccessDeserializer::new(m)).map(NamedOr)
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

/// A profile given by built-in name or in full (serde helper).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct NamedOr<T>(pub T);

by_name_or_map!(GpuProfile, "GPU profile");
by_name_or_map!(ModelProfile, "model");

/// Engine configuration (vLLM's flag names where vLLM has them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// The GPU: a built-in name (`a10g`, `l4`, `mi300x`) or a full [`GpuProfile`].
    pub gpu: NamedOr<GpuProfile>,
    /// The model: `llama-3-8b` or a full [`ModelProfile`].
    pub model: NamedOr<ModelProfile>,
    /// Maximum sequences in the running batch (`--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step, prefill chunks included (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
    /// Maximum prompt + output length (`--max-model-len`).
    pub max_model_len: u32,
    /// Tokens per KV block (`--block-size`).
    pub block_size: u32,
    /// Fraction of GPU memory the engine may use (`--gpu-memory-utilization`).
    pub gpu_memory_utilization: f64,
    /// Overrides the computed number of KV blocks (`--num-gpu-blocks-override`).
    pub num_gpu_blocks_override: Option<u32>,
    /// Automatic prefix caching (`--enable-prefix-caching`).
    pub enable_prefix_caching: bool,
    /// Emit one [`crate::engine::EngineEvent::Token`] per output token (the real-time server
    /// needs them for streaming; the scenario runner turns them off for speed).
    pub token_events: bool,
    /// Emit one [`crate::engine::EngineEvent::Step`] per engine step.
    pub step_events: bool,
    /// Version label of this instance (faults may target one version).
    pub version: String,
    /// Seed for everything random inside the engine (synthetic tokens, fault scatter).
    pub seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            gpu: NamedOr(GpuProfile::a10g()),
            model: NamedOr(ModelProfile::llama3_8b()),
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 8192,
            block_size: 16,
            gpu_memory_utilization: 0.9,
            num_gpu_blocks_override: None,
            enable_prefix_caching: true,
            token_events: true,
            step_events: false,
            version: "v1".into(),
            seed: 0,
        }
    }
}

impl EngineConfig {
    /// The default configuration on the named built-in GPU.
    pub fn for_gpu(name: &str) -> Option<Self> {
        GpuProfile::builtin(name).map(|g| EngineConfig { gpu: NamedOr(g), ..Self::default() })
    }

    /// The GPU profile.
    pub fn gpu(&self) -> &GpuProfile {
        &self.gpu.0
    }

    /// The model profile.
    pub fn model(&self) -> &ModelProfile {
        &self.model.0
    }

    /// Number of KV blocks: the override, or what fits in the memory left after weights and
    /// the activation reserve.
    pub fn num_gpu_blocks(&self) -> u32 {
        if let Some(n) = self.num_gpu_blocks_override {
            return n;
        }
        let gib = 1024.0 * 1024.0 * 1024.0;
        let gpu = self.gpu();
        let budget = gpu.memory_gib * gib * self.gpu_memory_utilization
            - self.model().weight_bytes()
            - gpu.activation_reserve_gib * gib;
        let block_bytes = self.model().kv_bytes_per_token() * f64::from(self.block_size.max(1));
        if budget <= 0.0 || block_bytes <= 0.0 { 0 } else { (budget / block_bytes).floor().min(u32::MAX as f64) as u32 }
    }

    /// Checks the limits; returns a description of the first problem.
    pub fn validate(&self) -> Result<(), String> {
        let g = self.gpu();
        let m = self.model();
        if self.max_num_seqs == 0 {
            return Err("max_num_seqs must be > 0".into());
        }
        if self.block_size == 0 {
            return Err("block_size must be > 0".into());
        }
        if self.max_num_batched_tokens == 0 {
            return Err("max_num_batched_tokens must be > 0".into());
        }
        if self.max_model_len < 2 {
            return Err("max_model_len must be >= 2".into());
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            return Err("gpu_memory_utilization must be in (0, 1]".into());
        }
        for (v, what) in [
            (g.effective_bandwidth_gbs, "gpu.effective_bandwidth_gbs"),
            (g.effective_tflops, "gpu.effective_tflops"),
            (g.memory_gib, "gpu.memory_gib"),
            (m.params, "model.params"),
            (m.dtype_bytes, "model.dtype_bytes"),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{what} must be a positive number"));
            }
        }
        if !(g.step_overhead_us.is_finite() && g.step_overhead_us >= 0.0) {
            return Err("gpu.step_overhead_us must be >= 0".into());
        }
        if m.num_layers == 0 || m.hidden_size == 0 || m.num_kv_heads == 0 || m.head_dim == 0 || m.vocab_size < 2 {
            return Err("model dimensions must be > 0".into());
        }
        let blocks = self.num_gpu_blocks();
        let needed = self.max_model_len.div_ceil(self.block_size);
        if blocks < needed {
            return Err(format!(
                "the KV pool has {blocks} blocks but one max_model_len sequence needs {needed}: \
                 lower max_model_len or raise memory"
            ));
        }
        Ok(())
    }
}

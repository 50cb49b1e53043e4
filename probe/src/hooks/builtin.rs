//! The built-in hooks: the study's quality signals and perturbation as life-cycle hooks over
//! [`crate::quality`] and [`crate::perturb`].
//!
//! - [`PerturbHook`] (`pre_inference`): the perturbed twin of a `--perturb` pair gets its
//!   distractor text inserted mid-prompt (in the last user message of a conversation).
//! - [`TleHook`] (`metric_finalize`): the first token's entropy from its top-K logprobs.
//! - [`RciHook`] (`metric_finalize`, over the streamed tokens): RCI against the request's
//!   reference answer, fed chunk by chunk as the stream delivered them.

use super::{Finalized, Hook, HookError, HookRequest, Points};
use crate::client::{Outcome, Prompt, TokenEvent};
use crate::perturb::{Profile, perturb_prompt};
use crate::quality::{Rci, RciWeights, tle_bits};
use futures::future::BoxFuture;
use std::borrow::Cow;

/// Inserts the perturbation profile's distractor into the perturbed twin of each pair.
#[derive(Debug, Clone)]
pub struct PerturbHook {
    profile: Profile,
    seed: u64,
}

impl PerturbHook {
    /// The hook for `profile`; distractors are deterministic in `seed` and the prompt's index.
    pub fn new(profile: Profile, seed: u64) -> PerturbHook {
        PerturbHook { profile, seed }
    }

    /// `prompt` with the distractor for prompt `index` inserted.
    pub fn perturb(&self, prompt: &Prompt, index: u64) -> Prompt {
        perturb_prompt(prompt, &self.profile.distractor(self.seed, index))
    }
}

impl Hook for PerturbHook {
    fn name(&self) -> &str {
        "perturb"
    }

    fn points(&self) -> Points {
        Points { pre_inference: true, ..Points::default() }
    }

    fn pre_inference<'a>(&'a self, req: &'a mut HookRequest<'_>) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            if req.variant.as_deref() == Some(self.profile.name.as_str())
                && let Some(i) = req.index
            {
                req.prompt = Cow::Owned(self.perturb(&req.prompt, i));
            }
            Ok(())
        })
    }
}

/// TLE of the first output token (`--logprobs K`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TleHook;

impl Hook for TleHook {
    fn name(&self) -> &str {
        "tle"
    }

    fn points(&self) -> Points {
        Points { metric_finalize: true, ..Points::default() }
    }

    fn metric_finalize<'a>(
        &'a self,
        _req: &'a HookRequest<'_>,
        _tokens: &'a [TokenEvent],
        outcome: &'a mut Outcome,
        out: &'a mut Finalized,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            out.tle_bits = outcome.first_top_logprobs.as_deref().and_then(tle_bits);
            Ok(())
        })
    }
}

/// RCI of each answer against its request's reference (when it has one).
#[derive(Debug, Clone, Copy)]
pub struct RciHook {
    weights: RciWeights,
}

impl RciHook {
    /// The hook with the run's weights.
    pub fn new(weights: RciWeights) -> RciHook {
        RciHook { weights }
    }
}

impl Hook for RciHook {
    fn name(&self) -> &str {
        "rci"
    }

    fn points(&self) -> Points {
        Points { metric_finalize: true, ..Points::default() }
    }

    fn applies(&self, req: &HookRequest<'_>) -> bool {
        req.reference.is_some()
    }

    fn needs_tokens(&self, _req: &HookRequest<'_>) -> bool {
        true
    }

    fn metric_finalize<'a>(
        &'a self,
        req: &'a HookRequest<'_>,
        tokens: &'a [TokenEvent],
        outcome: &'a mut Outcome,
        _out: &'a mut Finalized,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            let Some(reference) = &req.reference else { return Ok(()) };
            // As the client did: answers that ended (or ended without [DONE]) get an RCI.
            let ended = match &outcome.error {
                None => true,
                Some(e) => e.kind == crate::client::ErrorKind::Incomplete,
            };
            if ended {
                let mut rci = Rci::new(reference.clone());
                for t in tokens.iter().filter(|t| !t.text.is_empty()) {
                    rci.push(&t.text);
                }
                outcome.rci = Some(rci.finish(self.weights));
            }
            Ok(())
        })
    }
}

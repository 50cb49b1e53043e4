//! Perturbations (probe/README.md, Measurements; the study's §2.4): distractor text inserted
//! mid-prompt, image masking (`--image-mask-ratio`: a fraction of each image's pixels blacked
//! out, see [`crate::images::mask`]) and both together, each sent as a twin of the unperturbed
//! prompt; the pairs measure per perturbation type how often the answer changes, ΔTTFT,
//! Δe2e and ΔRCI.

use crate::client::{Outcome, Prompt};
use crate::metrics::LatencyHist;
use crate::quality::bleu;
use crate::report::PerturbReport;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Irrelevant sentences that a robust model should ignore.
const DISTRACTORS: &[&str] = &[
    "Note that the museum's east wing was repainted a pale green in the spring of 1987.",
    "Incidentally, a standard shipping container is about twelve metres long.",
    "The local bakery sells out of rye bread every Tuesday before noon.",
    "Some migratory birds navigate by sensing the Earth's magnetic field.",
    "The committee meeting was moved from room 204 to room 310 for unrelated reasons.",
    "A typical cup of coffee contains roughly ninety milligrams of caffeine.",
    "The old lighthouse keeper kept a log of every ship that passed for forty years.",
    "Marathon runners often eat pasta the evening before a race.",
    "The password for the guest network was changed last week.",
    "In 1923 a small town in Ohio briefly banned the playing of checkers on Sundays.",
    "Octopuses have three hearts and blue blood.",
    "The train to the airport departs every twelve minutes on weekdays.",
];

/// A perturbation profile: how much distractor text goes in.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Profile {
    /// The profile's name as given.
    pub name: String,
    /// Sentences inserted (ignored when `text` is set).
    pub sentences: usize,
    /// Fixed distractor text (`text:...`).
    pub text: Option<String>,
}

impl Profile {
    /// Parses a profile: `light` (1 sentence), `medium` (3), `heavy` (10), `sentences:N`,
    /// or `text:SOME TEXT`.
    pub fn parse(s: &str) -> Result<Profile, String> {
        let sentences = match s {
            "light" | "distractor" => 1,
            "medium" => 3,
            "heavy" => 10,
            _ => {
                if let Some(t) = s.strip_prefix("text:") {
                    if t.trim().is_empty() {
                        return Err("--perturb text: needs some text".into());
                    }
                    return Ok(Profile { name: s.into(), sentences: 0, text: Some(t.to_string()) });
                }
                match s.strip_prefix("sentences:").map(str::parse::<usize>) {
                    Some(Ok(n)) if (1..=1000).contains(&n) => n,
                    _ => {
                        return Err(format!(
                            "unknown perturbation profile {s:?}: use light, medium, heavy, sentences:N or text:TEXT"
                        ));
                    }
                }
            }
        };
        Ok(Profile { name: s.into(), sentences, text: None })
    }

    /// The distractor for request `index` (deterministic given the seed).
    pub fn distractor(&self, seed: u64, index: u64) -> String {
        if let Some(t) = &self.text {
            return t.clone();
        }
        let mut rng = StdRng::seed_from_u64(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5045_5254);
        let picks: Vec<&str> =
            (0..self.sentences).map(|_| DISTRACTORS[rng.random_range(0..DISTRACTORS.len())]).collect();
        picks.join(" ")
    }
}

/// Inserts `distractor` at the word boundary nearest the middle of `prompt`.
pub fn insert_mid(prompt: &str, distractor: &str) -> String {
    let mid = prompt.len() / 2;
    // Nearest whitespace to the middle, on a char boundary.
    let at = prompt
        .char_indices()
        .filter(|(_, c)| c.is_whitespace())
        .map(|(i, _)| i)
        .min_by_key(|&i| i.abs_diff(mid))
        .unwrap_or(prompt.len());
    let (a, b) = prompt.split_at(at);
    let (a, b) = (a.trim_end(), b.trim_start());
    match (a.is_empty(), b.is_empty()) {
        (true, true) => distractor.to_string(),
        (true, false) => format!("{distractor} {b}"),
        (false, true) => format!("{a} {distractor}"),
        (false, false) => format!("{a} {distractor} {b}"),
    }
}

/// `prompt` with `distractor` inserted mid-text (in the last user message of a conversation).
pub fn perturb_prompt(prompt: &Prompt, distractor: &str) -> Prompt {
    match prompt {
        Prompt::Text(t) => Prompt::Text(insert_mid(t, distractor)),
        Prompt::Messages(m) => {
            let mut m = m.clone();
            if let Some(last) = m.iter_mut().rev().find(|x| x.role == "user") {
                last.content = insert_mid(&last.content, distractor);
            }
            Prompt::Messages(m)
        }
    }
}

/// Checks an `--image-mask-ratio` (the study's range, 0–0.3).
pub fn parse_mask_ratio(r: f64) -> Result<f64, String> {
    if r.is_finite() && (0.0..=crate::images::MAX_MASK_RATIO).contains(&r) {
        Ok(r)
    } else {
        Err(format!("--image-mask-ratio must be in [0, {}], got {r}", crate::images::MAX_MASK_RATIO))
    }
}

/// A type of perturbation in the paired run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PerturbType {
    /// Distractor text (`--perturb PROFILE`).
    Text,
    /// Image masking (`--image-mask-ratio R`).
    ImageMask,
    /// Both at once (the study's "multimodal" row).
    TextImageMask,
}

impl PerturbType {
    /// The name in reports: `text`, `image_mask`, `text+image_mask`.
    pub fn name(self) -> &'static str {
        match self {
            PerturbType::Text => "text",
            PerturbType::ImageMask => "image_mask",
            PerturbType::TextImageMask => "text+image_mask",
        }
    }

    /// Whether the twin carries distractor text.
    pub fn has_text(self) -> bool {
        matches!(self, PerturbType::Text | PerturbType::TextImageMask)
    }

    /// Whether the twin's images are masked.
    pub fn masks_images(self) -> bool {
        matches!(self, PerturbType::ImageMask | PerturbType::TextImageMask)
    }
}

/// What the paired run perturbs: distractor text, image masking, or both.
#[derive(Debug, Clone, PartialEq)]
pub struct Perturbation {
    /// The text profile (`--perturb`).
    pub text: Option<Profile>,
    /// The image mask ratio (`--image-mask-ratio`, > 0; only when requests carry images).
    pub image_mask_ratio: Option<f64>,
}

impl Perturbation {
    /// The types sent for every prompt, in order: text, image_mask, text+image_mask (each
    /// when its parts are set).
    pub fn types(&self) -> Vec<PerturbType> {
        match (&self.text, self.image_mask_ratio) {
            (Some(_), Some(_)) => vec![PerturbType::Text, PerturbType::ImageMask, PerturbType::TextImageMask],
            (Some(_), None) => vec![PerturbType::Text],
            (None, Some(_)) => vec![PerturbType::ImageMask],
            (None, None) => vec![],
        }
    }

    /// The twin's label (span attribute `inferwatch.bench.perturbation`, hook `variant`): the
    /// text profile's name for text alone (as before), `image_mask:R`, `PROFILE+image_mask:R`.
    pub fn variant(&self, t: PerturbType) -> String {
        let name = self.text.as_ref().map_or("", |p| p.name.as_str());
        let r = self.image_mask_ratio.unwrap_or(0.0);
        match t {
            PerturbType::Text => name.to_string(),
            PerturbType::ImageMask => format!("image_mask:{r}"),
            PerturbType::TextImageMask => format!("{name}+image_mask:{r}"),
        }
    }

    /// The run's label in the report: the variants joined with `, `.
    pub fn label(&self) -> String {
        let v: Vec<String> = self.types().into_iter().map(|t| self.variant(t)).collect();
        v.join(", ")
    }
}

/// Paired measurements of one perturbation type (or of all pairs together).
#[derive(Debug, Clone, Default)]
pub struct PairStats {
    pairs: u64,
    changed: u64,
    divergence_sum: f64,
    ttft_delta_sum: f64,
    ttft_delta_n: u64,
    e2e_delta_sum: f64,
    rci_delta_sum: f64,
    rci_delta_n: u64,
    base_ttft: LatencyHist,
    pert_ttft: LatencyHist,
    base_e2e: LatencyHist,
    pert_e2e: LatencyHist,
}

fn mean(s: f64, n: u64) -> Option<f64> {
    (n > 0).then(|| s / n as f64)
}

impl PairStats {
    /// Adds one pair (ignored unless both succeeded).
    pub fn add(&mut self, base: &Outcome, pert: &Outcome) {
        if !base.ok() || !pert.ok() {
            return;
        }
        self.pairs += 1;
        if base.text != pert.text {
            self.changed += 1;
        }
        self.divergence_sum += 1.0 - bleu(&pert.text, &base.text);
        if let (Some(a), Some(b)) = (base.ttft, pert.ttft) {
            self.base_ttft.record(a);
            self.pert_ttft.record(b);
            self.ttft_delta_sum += b.as_secs_f64() - a.as_secs_f64();
            self.ttft_delta_n += 1;
        }
        self.base_e2e.record(base.e2e);
        self.pert_e2e.record(pert.e2e);
        self.e2e_delta_sum += pert.e2e.as_secs_f64() - base.e2e.as_secs_f64();
        if let (Some(a), Some(b)) = (&base.rci, &pert.rci) {
            self.rci_delta_sum += b.rci - a.rci;
            self.rci_delta_n += 1;
        }
    }

    fn changed_share(&self) -> f64 {
        if self.pairs > 0 { self.changed as f64 / self.pairs as f64 } else { 0.0 }
    }
}

/// One row of the per-type table: answer change rate, ΔTTFT, Δe2e, ΔRCI.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerturbTypeReport {
    /// `text`, `image_mask` or `text+image_mask`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The twin's label (`medium`, `image_mask:0.2`, `medium+image_mask:0.2`).
    pub variant: String,
    /// Pairs that both succeeded.
    pub pairs: u64,
    /// Share of pairs whose answers differ.
    pub answer_changed_share: f64,
    /// Mean 1 − BLEU-4 of the perturbed answer against the unperturbed one.
    pub mean_answer_divergence: Option<f64>,
    /// Mean TTFT of the unperturbed prompts, seconds.
    pub baseline_ttft_mean_s: Option<f64>,
    /// Mean TTFT of the perturbed twins, seconds.
    pub perturbed_ttft_mean_s: Option<f64>,
    /// Mean per-pair TTFT difference (perturbed − unperturbed), seconds.
    pub mean_ttft_delta_s: Option<f64>,
    /// Mean per-pair e2e difference, seconds.
    pub mean_e2e_delta_s: Option<f64>,
    /// Mean per-pair RCI difference (with reference answers).
    pub mean_rci_delta: Option<f64>,
}

/// The paired measurements of a run: all pairs, and per type.
#[derive(Debug, Clone, Default)]
pub struct PerturbAgg {
    all: PairStats,
    by_type: Vec<(PerturbType, String, PairStats)>,
}

impl PerturbAgg {
    /// Nothing measured yet.
    pub fn new() -> PerturbAgg {
        PerturbAgg::default()
    }

    /// Adds the pair of one prompt's baseline and its twin of type `t` (labelled `variant`).
    pub fn add(&mut self, t: PerturbType, variant: &str, base: &Outcome, pert: &Outcome) {
        self.all.add(base, pert);
        match self.by_type.iter_mut().find(|(k, _, _)| *k == t) {
            Some((_, _, s)) => s.add(base, pert),
            None => {
                let mut s = PairStats::default();
                s.add(base, pert);
                self.by_type.push((t, variant.to_string(), s));
            }
        }
    }

    /// The per-type rows, in the order the types were first seen.
    pub fn rows(&self) -> Vec<PerturbTypeReport> {
        self.by_type
            .iter()
            .map(|(t, v, s)| PerturbTypeReport {
                kind: t.name(),
                variant: v.clone(),
                pairs: s.pairs,
                answer_changed_share: s.changed_share(),
                mean_answer_divergence: mean(s.divergence_sum, s.pairs),
                baseline_ttft_mean_s: s.base_ttft.summary().mean,
                perturbed_ttft_mean_s: s.pert_ttft.summary().mean,
                mean_ttft_delta_s: mean(s.ttft_delta_sum, s.ttft_delta_n),
                mean_e2e_delta_s: mean(s.e2e_delta_sum, s.pairs),
                mean_rci_delta: mean(s.rci_delta_sum, s.rci_delta_n),
            })
            .collect()
    }

    /// The report: the top-level figures over all pairs of every type, and one row per type.
    pub fn report(&self, profile: &str) -> PerturbReport {
        let s = &self.all;
        PerturbReport {
            profile: profile.to_string(),
            pairs: s.pairs,
            answer_changed_share: s.changed_share(),
            mean_answer_divergence: mean(s.divergence_sum, s.pairs),
            baseline_ttft: s.base_ttft.summary(),
            perturbed_ttft: s.pert_ttft.summary(),
            baseline_e2e: s.base_e2e.summary(),
            perturbed_e2e: s.pert_e2e.summary(),
            mean_ttft_delta_s: mean(s.ttft_delta_sum, s.ttft_delta_n),
            mean_e2e_delta_s: mean(s.e2e_delta_sum, s.pairs),
            mean_rci_delta: mean(s.rci_delta_sum, s.rci_delta_n),
            by_type: self.rows(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_in_the_middle() {
        let p = "one two three four five six";
        assert_eq!(insert_mid(p, "XX"), "one two three XX four five six");
        assert_eq!(insert_mid("single", "XX"), "single XX");
        assert_eq!(insert_mid("", "XX"), "XX");
        // Multi-byte text is split on a char boundary.
        let u = insert_mid("héllo wörld ünïcode", "XX");
        assert!(u.contains("XX"));
    }

    #[test]
    fn profiles() {
        let p = Profile::parse("medium").unwrap();
        let d = p.distractor(1, 5);
        assert_eq!(d, p.distractor(1, 5));
        assert!(d.split(". ").count() >= 2);
        assert_eq!(Profile::parse("text:hello there").unwrap().distractor(0, 0), "hello there");
        assert_eq!(Profile::parse("sentences:4").unwrap().sentences, 4);
        assert!(Profile::parse("bogus").is_err());
        assert!(Profile::parse("sentences:0").is_err());
    }

    #[test]
    fn types_and_variants() {
        let text = Some(Profile::parse("medium").unwrap());
        let both = Perturbation { text: text.clone(), image_mask_ratio: Some(0.2) };
        assert_eq!(both.types(), vec![PerturbType::Text, PerturbType::ImageMask, PerturbType::TextImageMask]);
        assert_eq!(both.variant(PerturbType::Text), "medium");
        assert_eq!(both.variant(PerturbType::ImageMask), "image_mask:0.2");
        assert_eq!(both.variant(PerturbType::TextImageMask), "medium+image_mask:0.2");
        assert_eq!(both.label(), "medium, image_mask:0.2, medium+image_mask:0.2");
        let only_mask = Perturbation { text: None, image_mask_ratio: Some(0.1) };
        assert_eq!(only_mask.types(), vec![PerturbType::ImageMask]);
        assert!(PerturbType::TextImageMask.has_text() && PerturbType::TextImageMask.masks_images());
        assert!(!PerturbType::ImageMask.has_text());
        assert_eq!(parse_mask_ratio(0.3), Ok(0.3));
        assert!(
            parse_mask_ratio(0.31).is_err() && parse_mask_ratio(-0.1).is_err() && parse_mask_ratio(f64::NAN).is_err()
        );
        let m = Prompt::Messages(vec![
            crate::client::Message::new("user", "first question here"),
            crate::client::Message::new("assistant", "answer"),
            crate::client::Message::new("user", "one two"),
        ]);
        match perturb_prompt(&m, "XX") {
            Prompt::Messages(v) => {
                assert_eq!(v[0].content, "first question here");
                assert_eq!(v[2].content, "one XX two");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn aggregates_per_type() {
        use std::time::{Duration, Instant, SystemTime};
        let out = |text: &str, ttft_ms: u64| Outcome {
            start: Instant::now(),
            start_wall: SystemTime::now(),
            ttft: Some(Duration::from_millis(ttft_ms)),
            itl: Vec::new(),
            e2e: Duration::from_millis(ttft_ms + 100),
            input_tokens: 10,
            output_tokens: 4,
            usage_reported: true,
            text: text.into(),
            finish_reason: Some("stop".into()),
            response_id: None,
            response_model: None,
            first_top_logprobs: None,
            rci: None,
            error: None,
            tokens: Vec::new(),
        };
        let mut agg = PerturbAgg::new();
        let base = out("the answer is four", 100);
        agg.add(PerturbType::Text, "light", &base, &out("the answer is five", 130));
        agg.add(PerturbType::Text, "light", &base, &out("the answer is four", 110));
        agg.add(PerturbType::ImageMask, "image_mask:0.2", &base, &out("something else", 100));
        let r = agg.report("light, image_mask:0.2");
        assert_eq!(r.pairs, 3);
        assert_eq!(r.by_type.len(), 2);
        let t = &r.by_type[0];
        assert_eq!((t.kind, t.variant.as_str(), t.pairs), ("text", "light", 2));
        assert!((t.answer_changed_share - 0.5).abs() < 1e-12);
        assert!((t.mean_ttft_delta_s.unwrap() - 0.020).abs() < 1e-9, "{t:?}");
        let m = &r.by_type[1];
        assert_eq!((m.kind, m.pairs), ("image_mask", 1));
        assert_eq!(m.answer_changed_share, 1.0);
        assert!(m.mean_ttft_delta_s.unwrap().abs() < 1e-9);
        assert_eq!(m.mean_rci_delta, None, "no references, no ΔRCI");
    }
}

//! Perturbation profiles (probe/README.md, Measurements): distractor text inserted mid-prompt, to measure how
//! much answers and latency change against the unperturbed prompt.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
}

//! Every integration test of this crate in one test binary (one link instead of one per file).
mod fleet_score;
mod nab_score;
mod scenario_score;

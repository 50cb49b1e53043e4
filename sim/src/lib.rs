//! The simulated vLLM-like server: a discrete-event continuous-batching engine, degradation
//! faults, the real-time OpenAI-compatible server around it, and scenarios on a simulated clock.

pub mod engine;
pub mod faults;
pub mod scenario;
pub mod server;

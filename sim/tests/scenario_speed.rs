//! Prints the simulator's speed (simulated days per wall second for a 100-QPS service).
//! Debug builds are several times slower; run `cargo test --release -p inferwatch-sim
//! --test scenario_speed -- --nocapture` for the figure worth quoting.

use inferwatch_sim::scenario::speed::speed_report;

#[test]
fn speed_report_100_qps() {
    let r = speed_report(100.0, 600.0);
    println!(
        "speed: {:.3} simulated days per wall second at {} QPS on {} ({} requests, {} steps in {:.2} s wall; {:.0} requests/s){}",
        r.sim_days_per_wall_s,
        r.qps,
        r.gpu,
        r.requests,
        r.steps,
        r.wall_s,
        r.requests_per_wall_s,
        if cfg!(debug_assertions) { " [debug build]" } else { "" }
    );
    assert!(r.requests > 50_000, "all requests complete");
}

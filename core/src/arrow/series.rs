//! The stable 64-bit series id of a metric data point.

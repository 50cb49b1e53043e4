//! The Prometheus remote-write 1.0 messages (`prometheus.WriteRequest` of `prompb`), written
//! by hand with prost: only the fields this exporter sends.

/// One remote-write request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    /// The series, each with its samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    /// Type, help and unit per metric family.
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

/// One series: its labels (including `__name__`, sorted by name) and samples (oldest first).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    /// Labels, sorted by name.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Samples, sorted by timestamp.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// A label pair.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message)]
pub struct Label {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A sample.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// Metadata of one metric family.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricMetadata {
    /// The family type.
    #[prost(enumeration = "MetricType", tag = "1")]
    pub r#type: i32,
    /// The family name.
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    /// Help text.
    #[prost(string, tag = "4")]
    pub help: String,
    /// Unit.
    #[prost(string, tag = "5")]
    pub unit: String,
}

/// `MetricMetadata.MetricType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MetricType {
    /// Unknown.
    Unknown = 0,
    /// Counter.
    Counter = 1,
    /// Gauge.
    Gauge = 2,
    /// Histogram.
    Histogram = 3,
    /// Gauge histogram.
    Gaugehistogram = 4,
    /// Summary.
    Summary = 5,
    /// Info.
    Info = 6,
    /// State set.
    Stateset = 7,
}

/// The staleness marker Prometheus uses to end a series (a special NaN).
pub const STALE_NAN: f64 = f64::from_bits(0x7ff0_0000_0000_0002);

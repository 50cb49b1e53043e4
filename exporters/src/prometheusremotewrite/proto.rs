//! The Prometheus remote-write 1.0 messages (`prometheus.WriteRequest` of `prompb`), written
//! by hand with prost: only the fields this exporter sends. They mirror the vendored
//! `proto/prometheus/prompb/{remote,types}.proto` (no protoc in the workspace); the test below
//! parses those files and checks every message's field numbers, wire types and names.

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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::collections::BTreeMap;

    const TYPES: &str = include_str!("../../../proto/prometheus/prompb/types.proto");
    const REMOTE: &str = include_str!("../../../proto/prometheus/prompb/remote.proto");

    /// Messages of the vendored files not mirrored here (nothing the exporter sends uses them).
    const NOT_MIRRORED: [&str; 1] = ["Exemplar"];
    /// Fields of mirrored messages the exporter never sets (so the structs leave them out).
    const NOT_SENT: [(&str, u32); 1] = [("TimeSeries", 3)];

    /// The messages (field number → name, type, repeated) and enums (name → number) of a file.
    #[allow(clippy::type_complexity)]
    fn parse(
        text: &str,
    ) -> (BTreeMap<String, BTreeMap<u32, (String, String, bool)>>, BTreeMap<String, BTreeMap<String, i32>>) {
        let (mut messages, mut enums) = (BTreeMap::new(), BTreeMap::new());
        // The open blocks: (is_enum, name).
        let mut open: Vec<(bool, String)> = Vec::new();
        for raw in text.lines() {
            let line = raw.split("//").next().unwrap_or("").trim();
            if let Some(rest) = line.strip_prefix("message ").or_else(|| line.strip_prefix("enum ")) {
                let name = rest.trim_end_matches('{').trim().to_string();
                let is_enum = line.starts_with("enum ");
                if is_enum {
                    enums.insert(name.clone(), BTreeMap::new());
                } else {
                    messages.insert(name.clone(), BTreeMap::new());
                }
                open.push((is_enum, name));
            } else if line == "}" {
                open.pop();
            } else if let (Some((is_enum, block)), Some(decl)) = (open.last(), line.strip_suffix(';')) {
                if decl.starts_with("reserved") {
                    continue;
                }
                let (lhs, num) = decl.split_once('=').unwrap_or_else(|| panic!("unexpected line {raw:?}"));
                let num = num.trim();
                if *is_enum {
                    enums.get_mut(block).unwrap().insert(lhs.trim().to_string(), num.parse().unwrap());
                    continue;
                }
                let words: Vec<&str> = lhs.split_whitespace().collect();
                let (repeated, ty, name) = match words.as_slice() {
                    ["repeated", ty, name] => (true, *ty, *name),
                    [ty, name] => (false, *ty, *name),
                    other => panic!("unexpected field {other:?}"),
                };
                let ty = ty.trim_start_matches("prometheus.").to_string();
                messages.get_mut(block).unwrap().insert(num.parse().unwrap(), (name.to_string(), ty, repeated));
            }
        }
        (messages, enums)
    }

    /// (field number, wire type) of each top-level field in `buf`.
    fn wire_fields(mut buf: &[u8]) -> BTreeMap<u32, u8> {
        let mut out = BTreeMap::new();
        while !buf.is_empty() {
            let key = prost::encoding::decode_varint(&mut buf).unwrap();
            let (num, wt) = ((key >> 3) as u32, (key & 7) as u8);
            match wt {
                0 => {
                    prost::encoding::decode_varint(&mut buf).unwrap();
                }
                1 => buf = &buf[8..],
                2 => {
                    let n = prost::encoding::decode_varint(&mut buf).unwrap() as usize;
                    buf = &buf[n..];
                }
                other => panic!("wire type {other}"),
            }
            out.insert(num, wt);
        }
        out
    }

    /// The wire type of a proto3 field (repeated scalars would be packed: 2).
    fn wire_type(ty: &str, repeated: bool, enums: &BTreeMap<String, BTreeMap<String, i32>>) -> u8 {
        match ty {
            _ if repeated => 2,
            "double" => 1,
            "int64" => 0,
            t if enums.contains_key(t) => 0,
            _ => 2,
        }
    }

    /// Every mirrored message with every field set, encoded, with its Debug text.
    fn populated() -> Vec<(&'static str, Vec<u8>, String)> {
        let label = Label { name: "job".into(), value: "vllm".into() };
        let sample = Sample { value: 1.5, timestamp: 1_700_000_000_000 };
        let ts = TimeSeries { labels: vec![label.clone()], samples: vec![sample.clone()] };
        let md = MetricMetadata {
            r#type: MetricType::Counter as i32,
            metric_family_name: "requests".into(),
            help: "Requests.".into(),
            unit: "1".into(),
        };
        let wr = WriteRequest { timeseries: vec![ts.clone()], metadata: vec![md.clone()] };
        vec![
            ("Label", label.encode_to_vec(), format!("{label:?}")),
            ("Sample", sample.encode_to_vec(), format!("{sample:?}")),
            ("TimeSeries", ts.encode_to_vec(), format!("{ts:?}")),
            ("MetricMetadata", md.encode_to_vec(), format!("{md:?}")),
            ("WriteRequest", wr.encode_to_vec(), format!("{wr:?}")),
        ]
    }

    #[test]
    fn structs_match_the_vendored_proto_files() {
        let (mut messages, enums) = parse(TYPES);
        let (remote, _) = parse(REMOTE);
        messages.extend(remote);
        assert!(TYPES.contains("package prometheus;") && REMOTE.contains("package prometheus;"));
        assert!(REMOTE.contains("import \"types.proto\";") && REMOTE.contains("reserved  2;"));
        let ours = populated();
        let mut names: Vec<&str> = ours.iter().map(|(m, _, _)| *m).chain(NOT_MIRRORED).collect();
        names.sort();
        assert_eq!(names, messages.keys().map(String::as_str).collect::<Vec<_>>(), "the messages");
        for (msg, bytes, debug) in ours {
            let want: BTreeMap<u32, u8> = messages[msg]
                .iter()
                .filter(|(n, _)| !NOT_SENT.contains(&(msg, **n)))
                .map(|(n, (_, ty, rep))| (*n, wire_type(ty, *rep, &enums)))
                .collect();
            assert_eq!(wire_fields(&bytes), want, "{msg}: field numbers / wire types");
            for (n, (name, _, _)) in &messages[msg] {
                if !NOT_SENT.contains(&(msg, *n)) {
                    assert!(debug.contains(&format!("{name}: ")), "{msg}: no field {name} in {debug}");
                }
            }
        }
        let metric_types = &enums["MetricType"];
        assert_eq!(metric_types.len(), 8);
        for (name, n) in metric_types {
            let ours = MetricType::try_from(*n).map(|t| format!("{t:?}").to_ascii_uppercase());
            assert_eq!(ours.as_deref(), Ok(name.as_str()), "MetricType {n}");
        }
    }
}

//! Helpers shared by the integration tests: fixture paths, the Parquet fixture, the runtime.

#![allow(dead_code)]

use arrow_array::RecordBatch;
use inferwatch_ml::runtime::Search;
use std::path::PathBuf;

/// A file of tests/fixtures/lstm_ae/.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/lstm_ae")).join(name)
}

/// A file of models/.
pub fn model(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")).join(name)
}

/// The batches of features.parquet, in file order.
pub fn parquet_batches() -> Vec<RecordBatch> {
    let f = std::fs::File::open(fixture("features.parquet")).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .with_batch_size(97)
        .build()
        .unwrap();
    reader.map(|b| b.unwrap()).collect()
}

/// The runtime search the processor would do; `None` (with a skip line) when no runtime is
/// found, a failure when INFERWATCH_REQUIRE_ORT=1.
pub fn runtime_or_skip(test: &str) -> Option<Search> {
    let s = Search::from_process(None);
    match s.locate() {
        Ok(_) => Some(s),
        Err(e) if std::env::var("INFERWATCH_REQUIRE_ORT").as_deref() == Ok("1") => {
            panic!("INFERWATCH_REQUIRE_ORT=1 but {e}")
        }
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}

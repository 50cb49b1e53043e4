//! A library file that is not ONNX Runtime is refused with the fix (its own process: nothing
//! else loads a runtime first).

use inferwatch_ml::runtime::{Runtime, RuntimeError, Search};

#[test]
fn a_library_that_does_not_load_gives_the_fix() {
    let path = std::env::temp_dir().join(format!("iw-not-ort-{}.so.1.31.1", std::process::id()));
    std::fs::write(&path, b"not an ELF file").unwrap();
    let search = Search { configured: Some(path.clone()), ..Default::default() };
    let Err(e) = Runtime::load(&search) else { panic!("loaded a junk file") };
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(e, RuntimeError::Load { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("ONNX Runtime at {} cannot be used: ", path.display())), "{msg}");
    assert!(msg.contains("./scripts/test.sh") && msg.contains("x >= 24"), "{msg}");
}

//! A counting global allocator: current and peak heap bytes, and a hard cap that stops a
//! runaway allocation (the input being run is written to the dump file first).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static CAP: AtomicUsize = AtomicUsize::new(usize::MAX);
/// File descriptor the current input is written to when the cap is hit (-1: none).
static DUMP_FD: AtomicI32 = AtomicI32::new(-1);

/// The allocator: the system allocator with counters.
pub struct Counting;

fn grow(size: usize) -> bool {
    let now = CURRENT.fetch_add(size, Ordering::Relaxed) + size;
    if now > CAP.load(Ordering::Relaxed) {
        CURRENT.fetch_sub(size, Ordering::Relaxed);
        dump_current_input();
        return false;
    }
    PEAK.fetch_max(now, Ordering::Relaxed);
    true
}

/// Writes the input being run to the dump file, without allocating.
fn dump_current_input() {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let fd = DUMP_FD.swap(-1, Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    if let Ok(input) = crate::engine::CURRENT_INPUT.try_lock() {
        // SAFETY: the fd was opened by `set_dump_file` and is never closed; ManuallyDrop keeps it open.
        let f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        let _ = (&*f).write_all(&input);
    }
}

// SAFETY: every call is forwarded to `System`; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !grow(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !grow(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && !grow(new_size - layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > layout.size() {
                CURRENT.fetch_sub(new_size - layout.size(), Ordering::Relaxed);
            }
        } else if new_size < layout.size() {
            CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Heap bytes allocated now.
pub fn current() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// Resets the peak to the current use and returns it.
pub fn reset_peak() -> usize {
    let c = current();
    PEAK.store(c, Ordering::Relaxed);
    c
}

/// The highest heap use since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Sets the hard cap on heap bytes (allocation fails, and the process aborts, past it).
pub fn set_cap(bytes: usize) {
    CAP.store(bytes, Ordering::Relaxed);
}

/// Opens `path` as the file the current input is written to when the cap is hit.
pub fn set_dump_file(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let f = std::fs::File::create(path)?;
    DUMP_FD.store(f.into_raw_fd(), Ordering::Relaxed);
    Ok(())
}

/// Resident set size of this process in bytes (Linux; 0 elsewhere).
pub fn rss() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<usize>().ok()))
        .map_or(0, |pages| pages * 4096)
}

//! Prints Rust's `Display` rendering of f32 bit patterns.
//!
//! Reads one 8-hex-digit f32 bit pattern per line from stdin (blank lines are
//! skipped) and writes `HEX<TAB>display` per line, where `HEX` is the pattern
//! as eight upper-case hex digits and `display` is `format!("{}", f32)`, the
//! exact text `to_string()` puts into router_hist.rs's JSON. Used to generate
//! tests/data/f32_display_golden.txt and by tests/reference_harness.py.
//!
//! Build: `rustc -O tools/reference/f32_display.rs -o f32_display`

use std::io::{self, BufRead, BufWriter, Write};

fn main() {
    let stdin = io::stdin();
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for (lineno, line) in stdin.lock().lines().enumerate() {
        let line = line.expect("stdin is not valid UTF-8");
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let bits = u32::from_str_radix(text, 16).unwrap_or_else(|e| {
            eprintln!("line {}: bad f32 bit pattern {:?}: {}", lineno + 1, text, e);
            std::process::exit(2);
        });
        writeln!(out, "{:08X}\t{}", bits, f32::from_bits(bits)).expect("write failed");
    }
    out.flush().expect("flush failed");
}

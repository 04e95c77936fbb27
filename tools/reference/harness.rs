//! Drives the reference `router_hist.rs` (included verbatim, unmodified) so
//! tests can compare turbospark's JSON against the real Rust output.
//!
//! The caller sets the environment (`TURBOSPARK_ROUTER_HIST`,
//! `TURBOSPARK_ROUTER_TRACE`, `TURBOSPARK_PILOT_PROBE`,
//! `TURBOSPARK_ROUTER_LOGITS_LAYER`, `TURBOSPARK_ROUTER_LOGITS_PASS`); this
//! program sets nothing. It reads from stdin a first line
//! `num_layers num_experts top_k`, calls `RouterHistogram::from_env` with it,
//! then applies one op per line:
//!
//! * `r LAYER id id ...`     -> `record(LAYER, &[ids])`
//! * `p LAYER id id ...`     -> `record_prediction(LAYER, &[ids])`
//! * `l LAYER HEX HEX ...`   -> `record_router_logits(LAYER, &[f32::from_bits(HEX)...])`
//!
//! and finally drops the recorder, whose `Drop` writes the JSON file. If
//! `from_env` returns `None` it prints `none` to stdout (and ignores the ops).
//!
//! Build: `rustc -O tools/reference/harness.rs -o harness` (the reference is
//! expected at `../shared/reference/router_hist.rs` beside the repo folder).

#![allow(dead_code)]

#[path = "../../../shared/reference/router_hist.rs"]
mod router_hist;

use std::io::{self, BufRead};

fn parse_usize(tok: &str, lineno: usize) -> usize {
    tok.parse::<usize>().unwrap_or_else(|e| {
        eprintln!("line {}: bad integer {:?}: {}", lineno, tok, e);
        std::process::exit(2);
    })
}

fn main() {
    let stdin = io::stdin();
    let mut lines = stdin.lock().lines();
    let header = match lines.next() {
        Some(line) => line.expect("stdin is not valid UTF-8"),
        None => {
            eprintln!("missing header line `num_layers num_experts top_k`");
            std::process::exit(2);
        }
    };
    let dims: Vec<usize> = header
        .split_whitespace()
        .map(|tok| parse_usize(tok, 1))
        .collect();
    if dims.len() != 3 {
        eprintln!("header must be `num_layers num_experts top_k`, got {:?}", header);
        std::process::exit(2);
    }
    let Some(mut hist) = router_hist::RouterHistogram::from_env(dims[0], dims[1], dims[2]) else {
        println!("none");
        return;
    };
    for (index, line) in lines.enumerate() {
        let lineno = index + 2;
        let line = line.expect("stdin is not valid UTF-8");
        let mut toks = line.split_whitespace();
        let Some(op) = toks.next() else { continue };
        let layer = match toks.next() {
            Some(tok) => parse_usize(tok, lineno),
            None => {
                eprintln!("line {}: op {:?} needs a layer", lineno, op);
                std::process::exit(2);
            }
        };
        match op {
            "r" => {
                let ids: Vec<usize> = toks.map(|t| parse_usize(t, lineno)).collect();
                hist.record(layer, &ids);
            }
            "p" => {
                let ids: Vec<usize> = toks.map(|t| parse_usize(t, lineno)).collect();
                hist.record_prediction(layer, &ids);
            }
            "l" => {
                let values: Vec<f32> = toks
                    .map(|t| {
                        let bits = u32::from_str_radix(t, 16).unwrap_or_else(|e| {
                            eprintln!("line {}: bad f32 bits {:?}: {}", lineno, t, e);
                            std::process::exit(2);
                        });
                        f32::from_bits(bits)
                    })
                    .collect();
                hist.record_router_logits(layer, &values);
            }
            other => {
                eprintln!("line {}: unknown op {:?}", lineno, other);
                std::process::exit(2);
            }
        }
    }
    drop(hist);
}

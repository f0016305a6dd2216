//! The Rust server and client of the cross-language matrix: `testdata/matrix/README.md` is
//! their contract, `testdata/matrix/matrix.proto` their service.
#![forbid(unsafe_code)]

/// The `matrix.v1` package: messages, the `Matrix` trait, `MatrixServer` and `MatrixClient`.
#[allow(missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/matrix.v1.rs"));
}

pub mod server;

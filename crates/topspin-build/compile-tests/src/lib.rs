//! The `.proto` corpus of `topspin-build`, compiled: its tests exercise the generated code end to
//! end over loopback.
#![allow(missing_docs)]

/// `acme.*`: a realistic multi-file API.
pub mod acme {
    pub mod common {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/acme.common.v1.rs"));
        }
    }
    pub mod shop {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/acme.shop.v1.rs"));
        }
    }
}

/// Edge cases.
pub mod edge {
    pub mod r#type {
        include!(concat!(env!("OUT_DIR"), "/edge.r#type.rs"));
    }
    pub mod legacy {
        include!(concat!(env!("OUT_DIR"), "/edge.legacy.rs"));
    }
}

/// The file without a package.
pub mod nopkg {
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}

/// The benchmark service, `proto/bench/v1/bench.proto` at the repository root.
pub mod bench {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/bench.v1.rs"));
    }
}

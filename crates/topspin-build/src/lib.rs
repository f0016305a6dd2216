//! Generates topspin services from `.proto` files, from a `build.rs`, with no `protoc` anywhere.
//!
//! [`protox`] parses the `.proto` files (pure Rust), [`prost_build`] generates the messages
//! (`bytes` fields as [`bytes::Bytes`](https://docs.rs/bytes), so blobs decode without a copy),
//! and this crate generates, for each service `Foo`:
//!
//! - `trait Foo`: one method per RPC, for all four call kinds, returning `Send` futures (write
//!   them as `async fn`); server-streaming and bidirectional methods name their response stream
//!   type as an associated type `XxxStream`;
//! - `FooServer<T>`: wraps an implementation and registers its methods on a
//!   `topspin::ServerBuilder` (it implements `topspin::Service`);
//! - `FooClient`: a typed client over a `topspin::Channel`, one method per RPC;
//! - `foo_descriptor`: each method's full name, call kind, codec and message types.
//!
//! Every generated package module also gets `FILE_DESCRIPTOR_SET`, the encoded
//! `FileDescriptorSet` of the compiled files and their imports, which server reflection serves.
//!
//! The generated code needs these dependencies in the crate that includes it: `topspin`,
//! `prost`, `bytes`, `futures-core` and, when the `.proto` files use well-known types,
//! `prost-types`.
//!
//! # Example
//!
//! `build.rs`:
//!
//! ```no_run
//! fn main() -> Result<(), topspin_build::Error> {
//!     topspin_build::compile_protos(&["proto/kv/v1/kv.proto"], &["proto"])
//! }
//! ```
//!
//! and in the crate: `pub mod kv { include!(concat!(env!("OUT_DIR"), "/kv.v1.rs")); }`.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod codegen;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Name of the descriptor-set file written next to the generated code (see
/// [`Builder::file_descriptor_set_name`]).
pub const DEFAULT_FILE_DESCRIPTOR_SET_NAME: &str = "file_descriptor_set.bin";

/// Why code generation failed.
#[derive(Debug)]
pub enum Error {
    /// A `.proto` file could not be found, read or parsed, or it is invalid.
    Proto(Box<protox::Error>),
    /// Writing the output failed.
    Io(std::io::Error),
    /// `OUT_DIR` is not set and no output directory was given.
    NoOutDir,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Proto(e) => match (e.file(), location(e)) {
                (Some(file), Some((line, column))) => write!(f, "{file}:{line}:{column}: {e}"),
                (Some(file), None) => write!(f, "{file}: {e}"),
                _ => write!(f, "{e}"),
            },
            Error::Io(e) => write!(f, "could not write generated code: {e}"),
            Error::NoOutDir => {
                f.write_str("OUT_DIR is not set: call this from build.rs or set Builder::out_dir")
            }
        }
    }
}

/// Line and column (1-based) of the first label of a parse or check error.
fn location(e: &protox::Error) -> Option<(usize, usize)> {
    use miette::Diagnostic;
    let label = e.labels()?.next()?;
    let contents = e.source_code()?.read_span(label.inner(), 0, 0).ok()?;
    Some((contents.line() + 1, contents.column() + 1))
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Proto(e) => Some(&**e),
            Error::Io(e) => Some(e),
            Error::NoOutDir => None,
        }
    }
}

impl From<protox::Error> for Error {
    fn from(e: protox::Error) -> Error {
        Error::Proto(Box::new(e))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}

/// Compiles `.proto` files with the default settings into `OUT_DIR`: one `<package>.rs` per
/// protobuf package (`_.rs` for files without a package) plus the descriptor set.
///
/// `protos` are the files to generate code for; `includes` are the directories imports are
/// resolved against (each proto must lie under one of them). Code is generated for the files
/// listed and every file they import, except the well-known types (`google/protobuf/*.proto`),
/// which map to `prost-types` (or to the Rust paths given with [`Builder::extern_path`]).
///
/// ```no_run
/// // build.rs
/// fn main() -> Result<(), topspin_build::Error> {
///     topspin_build::compile_protos(&["proto/kv/v1/kv.proto"], &["proto"])
/// }
/// ```
pub fn compile_protos(
    protos: &[impl AsRef<Path>],
    includes: &[impl AsRef<Path>],
) -> Result<(), Error> {
    configure().compile(protos, includes)
}

/// A [`Builder`] with default settings.
pub fn configure() -> Builder {
    Builder::default()
}

/// Code generation settings.
///
/// ```no_run
/// fn main() -> Result<(), topspin_build::Error> {
///     topspin_build::configure()
///         .build_client(false)
///         .type_attribute(".kv.v1.Entry", "#[derive(Eq)]")
///         .compile(&["proto/kv/v1/kv.proto"], &["proto"])
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Builder {
    out_dir: Option<PathBuf>,
    build_server: bool,
    build_client: bool,
    descriptor_set_name: String,
    emit_rerun_if_changed: bool,
    type_attributes: Vec<(String, String)>,
    field_attributes: Vec<(String, String)>,
    extern_paths: Vec<(String, String)>,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder {
            out_dir: None,
            build_server: true,
            build_client: true,
            descriptor_set_name: DEFAULT_FILE_DESCRIPTOR_SET_NAME.to_owned(),
            emit_rerun_if_changed: true,
            type_attributes: Vec::new(),
            field_attributes: Vec::new(),
            extern_paths: Vec::new(),
        }
    }
}

/// The output of [`Builder::generate`]: Rust source per file name, and the descriptor set.
#[derive(Clone, Debug, Default)]
pub struct Generated {
    /// File name (`kv.v1.rs`) to Rust source.
    pub files: BTreeMap<String, String>,
    /// The encoded `google.protobuf.FileDescriptorSet` of the compiled files and their
    /// imports, dependencies first, with source info (comments).
    pub file_descriptor_set: Vec<u8>,
    /// Paths of every local `.proto` file read (for `cargo:rerun-if-changed`).
    pub inputs: Vec<PathBuf>,
}

impl Builder {
    /// Where to write the generated files (default: `OUT_DIR`).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.out_dir = Some(dir.into());
        self
    }

    /// Whether to generate the server traits and `XxxServer` wrappers (default true).
    pub fn build_server(mut self, yes: bool) -> Builder {
        self.build_server = yes;
        self
    }

    /// Whether to generate the `XxxClient` types (default true).
    pub fn build_client(mut self, yes: bool) -> Builder {
        self.build_client = yes;
        self
    }

    /// File name of the descriptor set written next to the code and included by
    /// `FILE_DESCRIPTOR_SET` (default [`DEFAULT_FILE_DESCRIPTOR_SET_NAME`]). Change it when
    /// two builders write into the same directory.
    pub fn file_descriptor_set_name(mut self, name: impl Into<String>) -> Builder {
        self.descriptor_set_name = name.into();
        self
    }

    /// Whether to print `cargo:rerun-if-changed` for every `.proto` read (default true).
    pub fn emit_rerun_if_changed(mut self, yes: bool) -> Builder {
        self.emit_rerun_if_changed = yes;
        self
    }

    /// Adds an attribute to matching messages and enums (see
    /// [`prost_build::Config::type_attribute`]).
    pub fn type_attribute(mut self, path: impl Into<String>, attr: impl Into<String>) -> Builder {
        self.type_attributes.push((path.into(), attr.into()));
        self
    }

    /// Adds an attribute to matching fields (see [`prost_build::Config::field_attribute`]).
    pub fn field_attribute(mut self, path: impl Into<String>, attr: impl Into<String>) -> Builder {
        self.field_attributes.push((path.into(), attr.into()));
        self
    }

    /// Uses existing Rust types for a protobuf package or type instead of generating them
    /// (see [`prost_build::Config::extern_path`]).
    pub fn extern_path(mut self, proto: impl Into<String>, rust: impl Into<String>) -> Builder {
        self.extern_paths.push((proto.into(), rust.into()));
        self
    }

    /// Parses and generates, returning the code instead of writing it.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// std::fs::write(
    ///     dir.path().join("echo.proto"),
    ///     "syntax = \"proto3\";\npackage echo.v1;\n\
    ///      message Msg { bytes data = 1; }\n\
    ///      service Echo { rpc Echo(Msg) returns (Msg); }\n",
    /// )?;
    /// let generated = topspin_build::configure()
    ///     .emit_rerun_if_changed(false)
    ///     .generate(&[dir.path().join("echo.proto")], &[dir.path()])?;
    /// let code = &generated.files["echo.v1.rs"];
    /// assert!(code.contains("pub data: ::prost::bytes::Bytes"));
    /// assert!(code.contains("pub trait Echo"));
    /// assert!(code.contains("pub struct EchoServer<T>"));
    /// assert!(code.contains("pub struct EchoClient"));
    /// assert!(code.contains("\"/echo.v1.Echo/Echo\""));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn generate(
        &self,
        protos: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<Generated, Error> {
        let mut compiler = protox::Compiler::new(includes)?;
        compiler.include_imports(true).include_source_info(true);
        compiler.open_files(protos)?;
        let inputs = compiler
            .files()
            .filter_map(|f| f.path().map(Path::to_path_buf))
            .collect();
        let file_descriptor_set = compiler.encode_file_descriptor_set();
        let fds = compiler.file_descriptor_set();

        let mut config = prost_build::Config::new();
        config.bytes(["."]);
        for (p, a) in &self.type_attributes {
            config.type_attribute(p, a);
        }
        for (p, a) in &self.field_attributes {
            config.field_attribute(p, a);
        }
        for (p, r) in &self.extern_paths {
            config.extern_path(p, r);
        }
        config.service_generator(Box::new(codegen::ServiceGen {
            server: self.build_server,
            client: self.build_client,
        }));
        let requests = fds
            .file
            .into_iter()
            .map(|f| {
                (
                    prost_build::Module::from_protobuf_package_name(f.package()),
                    f,
                )
            })
            .collect::<Vec<_>>();
        let names: Vec<(prost_build::Module, String)> = requests
            .iter()
            .map(|(m, _)| (m.clone(), m.to_file_name_or("_")))
            .collect();
        let modules = config.generate(requests)?;
        let mut files = BTreeMap::new();
        for (module, mut code) in modules {
            let name = names
                .iter()
                .find(|(m, _)| *m == module)
                .map(|(_, n)| n.clone())
                .unwrap_or_else(|| module.to_file_name_or("_"));
            code.push_str(&codegen::descriptor_set_const(&self.descriptor_set_name));
            files.insert(name, code);
        }
        Ok(Generated {
            files,
            file_descriptor_set,
            inputs,
        })
    }

    /// Parses, generates and writes the code (and the descriptor set) to the output directory.
    pub fn compile(
        &self,
        protos: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<(), Error> {
        let out = match &self.out_dir {
            Some(d) => d.clone(),
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or(Error::NoOutDir)?,
        };
        let generated = self.generate(protos, includes)?;
        if self.emit_rerun_if_changed && std::env::var_os("CARGO").is_some() {
            for p in &generated.inputs {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
        std::fs::create_dir_all(&out)?;
        write_if_changed(
            &out.join(&self.descriptor_set_name),
            &generated.file_descriptor_set,
        )?;
        for (name, code) in &generated.files {
            write_if_changed(&out.join(name), code.as_bytes())?;
        }
        Ok(())
    }
}

fn write_if_changed(path: &Path, content: &[u8]) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == content) {
        return Ok(());
    }
    std::fs::write(path, content)
}

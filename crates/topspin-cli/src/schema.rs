//! Where the CLI gets descriptors: server reflection, or `.proto` files compiled on the spot.

use anyhow::{anyhow, bail, Context};
use prost::Message;
use prost_reflect::{DescriptorPool, MethodDescriptor};
use std::path::{Path, PathBuf};
use std::time::Duration;
use topspin::{Channel, Code, Request};
use topspin_reflection::v1;

/// A source of descriptors.
pub(crate) enum Schema {
    /// Ask the server (`topspin.reflection.v1`).
    Reflection {
        client: v1::ReflectionClient,
        timeout: Option<Duration>,
    },
    /// `.proto` files given with `--proto`.
    Files(DescriptorPool),
}

/// Where a `--proto` file is: the path itself if it exists, else (a relative path) under the
/// first `-I` directory that holds it, as protoc resolves its inputs.
fn locate(proto: &Path, includes: &[PathBuf]) -> anyhow::Result<PathBuf> {
    if proto.exists() {
        return Ok(proto.to_owned());
    }
    if proto.is_relative() {
        if let Some(found) = includes.iter().map(|i| i.join(proto)).find(|p| p.exists()) {
            return Ok(found);
        }
    }
    // Not found anywhere: name every place looked at.
    let error = std::fs::metadata(proto).err();
    let mut message = format!("could not read {}", proto.display());
    if let Some(e) = error {
        message.push_str(&format!(": {e}"));
    }
    if proto.is_relative() && !includes.is_empty() {
        let dirs: Vec<String> = includes.iter().map(|i| i.display().to_string()).collect();
        message.push_str(&format!(
            " (nor found under the import paths {})",
            dirs.join(", ")
        ));
    }
    bail!(message)
}

/// Compiles `--proto` files with `-I` import paths (default: each file's directory). A file
/// is found as given or, relative, under an import path.
pub(crate) fn compile_files(
    protos: &[PathBuf],
    includes: &[PathBuf],
) -> anyhow::Result<DescriptorPool> {
    let protos = protos
        .iter()
        .map(|p| locate(p, includes))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut includes = includes.to_vec();
    if includes.is_empty() {
        for p in &protos {
            let dir = p.parent().map(PathBuf::from).unwrap_or_default();
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            if !includes.contains(&dir) {
                includes.push(dir);
            }
        }
    }
    let mut compiler = protox::Compiler::new(&includes).map_err(|e| anyhow!("{e}"))?;
    compiler.include_imports(true).include_source_info(true);
    compiler
        .open_files(&protos)
        .map_err(|e| anyhow!("{}", topspin_build::Error::from(e)))?;
    Ok(compiler.descriptor_pool())
}

impl Schema {
    pub(crate) fn reflection(channel: Channel, timeout: Option<Duration>) -> Schema {
        Schema::Reflection {
            client: v1::ReflectionClient::from(channel),
            timeout,
        }
    }

    fn request<T>(message: T, timeout: Option<Duration>) -> Request<T> {
        match timeout {
            Some(t) => Request::new(message).with_timeout(t),
            None => Request::new(message),
        }
    }

    /// Every service with its methods, sorted by name.
    pub(crate) async fn services(&self) -> anyhow::Result<Vec<v1::ServiceInfo>> {
        match self {
            Schema::Reflection { client, timeout } => {
                let r = client
                    .list_services(Self::request(v1::ListServicesRequest {}, *timeout))
                    .await
                    .map_err(reflection_error)?;
                Ok(r.into_inner().services)
            }
            Schema::Files(pool) => {
                let mut out: Vec<v1::ServiceInfo> = pool
                    .services()
                    .map(|s| v1::ServiceInfo {
                        name: s.full_name().to_owned(),
                        file: s.parent_file().name().to_owned(),
                        methods: s
                            .methods()
                            .map(|m| v1::MethodInfo {
                                name: m.name().to_owned(),
                                path: format!("/{}/{}", s.full_name(), m.name()),
                                client_streaming: m.is_client_streaming(),
                                server_streaming: m.is_server_streaming(),
                                input_type: m.input().full_name().to_owned(),
                                output_type: m.output().full_name().to_owned(),
                            })
                            .collect(),
                    })
                    .collect();
                out.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(out)
            }
        }
    }

    /// Descriptors that define `symbol` (with their imports), or `None` if it is unknown.
    pub(crate) async fn pool_for(&self, symbol: &str) -> anyhow::Result<Option<DescriptorPool>> {
        match self {
            Schema::Files(pool) => Ok(Some(pool.clone())),
            Schema::Reflection { client, timeout } => {
                let req = v1::FileContainingSymbolRequest {
                    symbol: symbol.to_owned(),
                };
                let files = match client
                    .file_containing_symbol(Self::request(req, *timeout))
                    .await
                {
                    Ok(r) => r.into_inner().files,
                    Err(s) if s.code() == Code::NotFound => return Ok(None),
                    Err(s) => return Err(reflection_error(s)),
                };
                let mut pool = DescriptorPool::new();
                let protos = files
                    .into_iter()
                    .map(prost_types::FileDescriptorProto::decode)
                    .collect::<Result<Vec<_>, _>>()
                    .context("the server sent an invalid file descriptor")?;
                pool.add_file_descriptor_protos(protos)
                    .context("the server sent inconsistent file descriptors")?;
                Ok(Some(pool))
            }
        }
    }

    /// Resolves `pkg.Service/Method` (also `pkg.Service.Method`, `/pkg.Service/Method`). Errors
    /// list the services or methods that do exist.
    pub(crate) async fn method(&self, name: &str) -> anyhow::Result<MethodDescriptor> {
        let trimmed = name.trim_start_matches('/');
        let (service, method) = match trimmed.split_once('/') {
            Some(parts) => parts,
            None => trimmed.rsplit_once('.').ok_or_else(|| {
                anyhow!("{name:?} is not a method name: write it as package.Service/Method")
            })?,
        };
        let pool = self.pool_for(service).await?;
        let svc = pool.as_ref().and_then(|p| p.get_service_by_name(service));
        let Some(svc) = svc else {
            let services = self.services().await?;
            let names: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
            if names.is_empty() {
                bail!("there is no service {service:?}, and no services are described");
            }
            bail!(
                "there is no service {service:?}; the services are:\n  {}",
                names.join("\n  ")
            );
        };
        if let Some(m) = svc.methods().find(|m| m.name() == method) {
            return Ok(m);
        }
        let names: Vec<String> = svc
            .methods()
            .map(|m| format!("{}/{}", svc.full_name(), m.name()))
            .collect();
        bail!(
            "service {} has no method {method:?}; its methods are:\n  {}",
            svc.full_name(),
            names.join("\n  ")
        )
    }
}

/// A failed reflection call: explain that the server may not have reflection enabled.
fn reflection_error(s: topspin::Status) -> anyhow::Error {
    if s.code() == Code::Unimplemented {
        anyhow!(
            "the server does not offer reflection ({}: {}); add topspin_reflection::Reflection \
             to it, or pass the .proto files with --proto",
            s.code().name(),
            s.message()
        )
    } else {
        anyhow::Error::new(crate::CallFailed(s)).context("the reflection call failed")
    }
}

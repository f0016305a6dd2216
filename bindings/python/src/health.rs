//! Health checking (`grpc.health.v1`) and server reflection for Python servers: the Rust
//! services of `topspin-health` and `topspin-reflection`, added to the server's builder as the
//! Rust examples add them. Their calls are answered by the runtime, without the GIL.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use topspin_health::{HealthService, ServingStatus};
use topspin_reflection::Reflection;

/// The status table of a `grpc.health.v1.Health` service (`topspin_health`'s service and its
/// reporter). `""` stands for the whole server, which starts `SERVING`.
#[pyclass(frozen, module = "topspin._native")]
pub(crate) struct Health {
    pub(crate) service: HealthService,
}

#[pymethods]
impl Health {
    #[new]
    fn new() -> Health {
        let (service, _) = topspin_health::service();
        Health { service }
    }

    /// Sets the status of `service` (a `HealthCheckResponse.ServingStatus` number);
    /// `SERVICE_UNKNOWN` (3) forgets it. Ignored after `shutdown` until `resume`.
    fn set(&self, service: &str, status: i32) -> PyResult<()> {
        let status = ServingStatus::try_from(status)
            .map_err(|_| PyValueError::new_err(format!("no serving status {status}")))?;
        self.service.reporter().set_serving_status(service, status);
        Ok(())
    }

    /// Forgets `service`: `Check` answers `NOT_FOUND`, watchers see `SERVICE_UNKNOWN`.
    fn clear(&self, service: &str) {
        self.service.reporter().clear_service_status(service);
    }

    /// The status `service` reports (its number), `None` if it is unknown.
    fn status(&self, service: &str) -> Option<i32> {
        self.service.reporter().status(service).map(|s| s as i32)
    }

    /// Every known service `NOT_SERVING`; later changes are ignored until `resume`. The
    /// server's graceful shutdown does this by itself (then ends the open watches).
    fn shutdown(&self) {
        self.service.reporter().shutdown();
    }

    /// Undoes `shutdown`: every known service `SERVING` again.
    fn resume(&self) {
        self.service.reporter().resume();
    }
}

/// A reflection service describing the files of these encoded `FileDescriptorSet`s, and
/// itself (`topspin.reflection.v1` and gRPC's `grpc.reflection.v1` and `v1alpha`).
pub(crate) fn reflection(file_descriptor_sets: &[Bound<'_, PyBytes>]) -> PyResult<Reflection> {
    let sets: Vec<&[u8]> = file_descriptor_sets.iter().map(|b| b.as_bytes()).collect();
    Reflection::new(&sets).map_err(|e| PyValueError::new_err(format!("topspin: {e}")))
}

/// The encoded `FileDescriptorSet` of `grpc/health/v1/health.proto`.
pub(crate) fn health_file_descriptor_set() -> &'static [u8] {
    topspin_health::v1::FILE_DESCRIPTOR_SET
}

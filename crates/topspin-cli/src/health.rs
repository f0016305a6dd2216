//! `topspin health`: asks a server's `grpc.health.v1.Health` service for a status, once or
//! following every change, and turns the answer into an exit status a probe can use.

use crate::CallFailed;
use std::io::Write;
use std::time::Duration;
use topspin::{Channel, Code, Request, Status};
use topspin_health::v1::{HealthCheckRequest, HealthClient};
use topspin_health::ServingStatus;

/// Exit status: the service is `SERVING`.
pub(crate) const SERVING: u8 = 0;
/// Exit status: `NOT_SERVING` or `UNKNOWN`.
pub(crate) const NOT_SERVING: u8 = 1;
/// Exit status: the server does not know the service, or has no health service.
pub(crate) const UNKNOWN_SERVICE: u8 = 2;
/// Exit status: the server could not be reached (refused, not topspin, connection lost).
pub(crate) const UNREACHABLE: u8 = 3;
/// Exit status: no answer in time.
pub(crate) const NO_ANSWER: u8 = 4;
/// Exit status: any other error.
pub(crate) const OTHER: u8 = 5;

/// The exit status for a status the server reported.
fn exit_status(status: ServingStatus) -> u8 {
    match status {
        ServingStatus::Serving => SERVING,
        ServingStatus::NotServing | ServingStatus::Unknown => NOT_SERVING,
        ServingStatus::ServiceUnknown => UNKNOWN_SERVICE,
    }
}

/// A health call failed with `status`: the error to print, and the exit status.
fn failed(status: Status, service: &str) -> (anyhow::Error, u8) {
    let code = match status.code() {
        Code::NotFound => {
            let what = if service.is_empty() {
                "the server as a whole (\"\")".to_owned()
            } else {
                format!("service {service:?}")
            };
            let e = anyhow::anyhow!("the server reports no health status for {what} (NOT_FOUND)");
            return (e, UNKNOWN_SERVICE);
        }
        Code::Unimplemented => {
            let e = anyhow::anyhow!(
                "the server does not offer health checking ({}): add topspin_health::service() \
                 to it",
                topspin_health::SERVICE_NAME
            );
            return (e, UNKNOWN_SERVICE);
        }
        Code::Unavailable => UNREACHABLE,
        Code::DeadlineExceeded => NO_ANSWER,
        _ => OTHER,
    };
    (CallFailed(status).into(), code)
}

/// The exit status for an error that ended the command (the health call's own failures are
/// mapped by [`check`] and [`watch`]).
pub(crate) fn exit_status_of(e: &anyhow::Error) -> u8 {
    match e.chain().find_map(|c| c.downcast_ref::<CallFailed>()) {
        Some(CallFailed(s)) if s.code() == Code::Unavailable => UNREACHABLE,
        Some(CallFailed(s)) if s.code() == Code::DeadlineExceeded => NO_ANSWER,
        _ => OTHER,
    }
}

fn print(status: ServingStatus) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", status.as_str_name())?;
    out.flush()
}

fn request(service: &str, timeout: Option<Duration>) -> Request<HealthCheckRequest> {
    let r = Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    match timeout {
        Some(t) => r.with_timeout(t),
        None => r,
    }
}

/// `Check`: prints the status; the exit status says what it was.
pub(crate) async fn check(
    channel: Channel,
    service: &str,
    timeout: Option<Duration>,
) -> Result<u8, (anyhow::Error, u8)> {
    let client = HealthClient::from(channel);
    let status = client
        .check(request(service, timeout))
        .await
        .map_err(|s| failed(s, service))?
        .into_inner()
        .status();
    print(status).map_err(|e| (e.into(), OTHER))?;
    Ok(exit_status(status))
}

/// `Watch`: prints each status as it comes; when the server ends the stream, the exit status
/// is the last status's.
pub(crate) async fn watch(
    channel: Channel,
    service: &str,
    timeout: Option<Duration>,
) -> Result<u8, (anyhow::Error, u8)> {
    let client = HealthClient::from(channel);
    let mut stream = client
        .watch(request(service, timeout))
        .await
        .map_err(|s| failed(s, service))?
        .into_inner();
    let mut last = None;
    while let Some(response) = stream.message().await.map_err(|s| failed(s, service))? {
        let status = response.status();
        print(status).map_err(|e| (e.into(), OTHER))?;
        last = Some(status);
    }
    match last {
        Some(status) => Ok(exit_status(status)),
        None => Err((
            anyhow::anyhow!("the server ended the watch without a status"),
            OTHER,
        )),
    }
}

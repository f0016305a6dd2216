//! The reflection service over loopback, through its generated client.

use prost::Message;
use std::time::Duration;
use topspin::{Code, Request, Server};
use topspin_reflection::v1::{self, ReflectionClient};
use topspin_reflection::Reflection;

async fn start() -> (ReflectionClient, topspin::ShutdownHandle) {
    let server = Server::builder()
        .add_service(Reflection::new(&[]).unwrap())
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let address = server.local_addr().clone();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    (ReflectionClient::connect(address).await.unwrap(), handle)
}

#[tokio::test]
async fn lists_and_serves_descriptors() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let (client, shutdown) = start().await;
        let list = client
            .list_services(Request::new(v1::ListServicesRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(list.services.len(), 1);
        let svc = &list.services[0];
        assert_eq!(svc.name, "topspin.reflection.v1.Reflection");
        assert_eq!(svc.file, "topspin/reflection/v1/reflection.proto");
        let names: Vec<&str> = svc.methods.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            ["ListServices", "FileContainingSymbol", "FileByName"]
        );
        assert_eq!(
            svc.methods[0].path,
            "/topspin.reflection.v1.Reflection/ListServices"
        );
        assert_eq!(
            svc.methods[0].input_type,
            "topspin.reflection.v1.ListServicesRequest"
        );

        for symbol in [
            "topspin.reflection.v1.Reflection",
            "topspin.reflection.v1.Reflection.FileByName",
            "/topspin.reflection.v1.Reflection/FileByName",
            "topspin.reflection.v1.MethodInfo",
        ] {
            let files = client
                .file_containing_symbol(Request::new(v1::FileContainingSymbolRequest {
                    symbol: symbol.into(),
                }))
                .await
                .unwrap()
                .into_inner()
                .files;
            assert_eq!(files.len(), 1, "{symbol}");
            let file = prost_types::FileDescriptorProto::decode(files[0].clone()).unwrap();
            assert_eq!(file.name(), "topspin/reflection/v1/reflection.proto");
        }
        let err = client
            .file_containing_symbol(Request::new(v1::FileContainingSymbolRequest {
                symbol: "no.Such".into(),
            }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert!(err.message().contains("no.Such"));

        let by_name = client
            .file_by_name(Request::new(v1::FileByNameRequest {
                name: "topspin/reflection/v1/reflection.proto".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(by_name.files.len(), 1);
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await
    .expect("bounded");
}

#[test]
fn rejects_garbage_and_accepts_duplicates() {
    assert!(Reflection::new(&[b"\xff\xff\xff"]).is_err());
    // The same set twice (as when two packages share one build) is fine.
    let r = Reflection::new(&[v1::FILE_DESCRIPTOR_SET, v1::FILE_DESCRIPTOR_SET]).unwrap();
    // Itself and gRPC's reflection (v1, v1alpha), each once.
    assert_eq!(r.pool().services().len(), 3);
}

//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`) on a topspin server's gRPC
//! face, asked by tonic's client over HTTP/2 — what grpcurl and Postman do.

use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;
use topspin::Server;
use topspin_reflection::grpc_v1::server_reflection_request::MessageRequest as Q;
use topspin_reflection::grpc_v1::server_reflection_response::MessageResponse as A;
use topspin_reflection::grpc_v1::{ServerReflectionRequest, ServerReflectionResponse};
use topspin_reflection::{grpc_v1alpha, Reflection};

async fn ask(hp: &str, path: &'static str, questions: Vec<Q>) -> Vec<ServerReflectionResponse> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{hp}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.unwrap();
    let reqs: Vec<ServerReflectionRequest> = questions
        .into_iter()
        .map(|q| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(q),
        })
        .collect();
    let codec =
        tonic_prost::ProstCodec::<ServerReflectionRequest, ServerReflectionResponse>::default();
    let resp = g
        .streaming(
            tonic::Request::new(futures_util::stream::iter(reqs)),
            PathAndQuery::from_static(path),
            codec,
        )
        .await
        .unwrap();
    let mut s = resp.into_inner();
    let mut out = Vec::new();
    while let Some(r) = s.message().await.unwrap() {
        out.push(r);
    }
    out
}

#[tokio::test]
async fn grpc_reflection_lists_and_describes_over_the_grpc_face() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let server = Server::builder()
            .add_service(Reflection::new(&[]).unwrap())
            .bind("tcp://127.0.0.1:0")
            .await
            .unwrap();
        let hp = server.local_addr().to_string().replace("tcp://", "");
        let shutdown = server.shutdown_handle();
        tokio::spawn(server.serve());

        for path in [
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            let answers = ask(
                &hp,
                path,
                vec![
                    Q::ListServices(String::new()),
                    Q::FileContainingSymbol("grpc.reflection.v1.ServerReflection".into()),
                    Q::FileByFilename("topspin/reflection/v1/reflection.proto".into()),
                    Q::FileContainingSymbol("no.such.Thing".into()),
                    Q::AllExtensionNumbersOfType("grpc.reflection.v1.ServiceResponse".into()),
                ],
            )
            .await;
            assert_eq!(answers.len(), 5);
            let Some(A::ListServicesResponse(l)) = &answers[0].message_response else {
                panic!("{:?}", answers[0]);
            };
            let names: Vec<&str> = l.service.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(
                names,
                [
                    "grpc.reflection.v1.ServerReflection",
                    "grpc.reflection.v1alpha.ServerReflection",
                    "topspin.reflection.v1.Reflection"
                ]
            );
            for a in &answers[1..3] {
                let Some(A::FileDescriptorResponse(f)) = &a.message_response else {
                    panic!("{a:?}");
                };
                let file = <prost_types::FileDescriptorProto as prost::Message>::decode(
                    f.file_descriptor_proto[0].as_ref(),
                )
                .unwrap();
                assert!(file.name().ends_with("reflection.proto"), "{file:?}");
            }
            let Some(A::ErrorResponse(e)) = &answers[3].message_response else {
                panic!("{:?}", answers[3]);
            };
            assert_eq!(e.error_code, topspin::Code::NotFound as i32);
            assert!(matches!(
                &answers[4].message_response,
                Some(A::AllExtensionNumbersResponse(x)) if x.extension_number.is_empty()
            ));
            assert!(answers[1].original_request.is_some());
        }
        let _ = grpc_v1alpha::FILE_DESCRIPTOR_SET;
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await
    .unwrap();
}

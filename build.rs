//! Generates the KMS v2 plugin API (client, and the server of the test plugin) and the stored `EncryptedObject`
//! from proto/kmsv2/ with protoc, as etcd-client's build already does for etcd's API.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/kmsv2");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/kmsv2/api.proto", "proto/kmsv2/encrypted_object.proto"], &["proto/kmsv2"])?;
    Ok(())
}

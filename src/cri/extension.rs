//! CRI requests that carry fields newer than the `k8s-cri` bindings: an image
//! volume's subPath (`Mount.image_sub_path`, runtime.v1 field 10, the Image
//! Volume KEP's beta).
//!
//! A request is encoded with the bindings, less the mounts that need the
//! newer fields; then the messages of `proto/cri/v1/extension.proto` are
//! appended: the request's `config` again, holding every mount, each encoded
//! with the bindings followed by its newer fields. A protobuf parser merges a
//! message field that occurs twice and appends repeated entries, so the
//! runtime reads the request the kubelet would have sent. The call goes out
//! with a codec that sends these bytes as they are ([`EncodedCodec`]).

use std::collections::BTreeMap;

use k8s_cri::v1 as cri;
use prost::Message;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic_prost::ProstDecoder;

use crate::proto::cri_extension::{ContainerMounts, CreateContainerMounts, MountExtension};

/// The subPath of each image-volume mount of a container, by the mount's
/// container path (unique within a container): what the kubelet sends as
/// `Mount.image_sub_path`. Empty for most containers.
pub type ImageSubPaths = BTreeMap<String, String>;

/// The wire encoding of `runtime.v1.CreateContainerRequest` `req` with
/// `sub_paths` set on the mounts they name; exactly the bindings' encoding
/// when `sub_paths` names none of the mounts.
#[must_use]
pub fn encode_create_container(
    req: &cri::CreateContainerRequest,
    sub_paths: &ImageSubPaths,
) -> Vec<u8> {
    let mounts = req.config.as_ref().map_or(&[][..], |c| &c.mounts[..]);
    if !mounts
        .iter()
        .any(|m| sub_paths.contains_key(&m.container_path))
    {
        return req.encode_to_vec();
    }
    let mut base = req.clone();
    if let Some(config) = base.config.as_mut() {
        config.mounts.clear();
    }
    let mut out = base.encode_to_vec();
    let encoded_mounts = mounts
        .iter()
        .map(|m| {
            let mut bytes = m.encode_to_vec();
            if let Some(sub) = sub_paths.get(&m.container_path) {
                let newer = MountExtension {
                    image_sub_path: sub.clone(),
                };
                bytes.extend(newer.encode_to_vec());
            }
            bytes
        })
        .collect();
    let all_mounts = CreateContainerMounts {
        config: Some(ContainerMounts {
            mounts: encoded_mounts,
        }),
    };
    out.extend(all_mounts.encode_to_vec());
    out
}

/// A gRPC codec that sends a request already encoded (bytes) and decodes the
/// response `U` with prost.
#[derive(Debug)]
pub struct EncodedCodec<U>(std::marker::PhantomData<U>);

impl<U> Default for EncodedCodec<U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

/// The encoder of [`EncodedCodec`]: writes the bytes as they are.
#[derive(Debug, Default)]
pub struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl<U: Message + Default + Send + 'static> Codec for EncodedCodec<U> {
    type Encode = Vec<u8>;
    type Decode = U;
    type Encoder = BytesEncoder;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> ProstDecoder<U> {
        ProstDecoder::new(tonic::codec::BufferSettings::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> cri::CreateContainerRequest {
        let image = cri::ImageSpec {
            image: "sha256:abc".into(),
            user_specified_image: "example.com/data:1".into(),
            ..Default::default()
        };
        cri::CreateContainerRequest {
            pod_sandbox_id: "sandbox-1".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "c".into(),
                    attempt: 2,
                }),
                mounts: vec![
                    cri::Mount {
                        container_path: "/etc/hosts".into(),
                        host_path: "/pods/x/etc-hosts".into(),
                        ..Default::default()
                    },
                    cri::Mount {
                        container_path: "/data".into(),
                        readonly: true,
                        image: Some(image.clone()),
                        ..Default::default()
                    },
                    cri::Mount {
                        container_path: "/whole".into(),
                        readonly: true,
                        image: Some(image),
                        ..Default::default()
                    },
                ],
                command: vec!["sleep".into(), "1".into()],
                ..Default::default()
            }),
            sandbox_config: Some(cri::PodSandboxConfig {
                hostname: "web".into(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn without_sub_paths_the_encoding_is_the_bindings() {
        let req = request();
        assert_eq!(
            encode_create_container(&req, &ImageSubPaths::new()),
            req.encode_to_vec()
        );
        let elsewhere: ImageSubPaths = [("/other".to_string(), "dir".to_string())].into();
        assert_eq!(
            encode_create_container(&req, &elsewhere),
            req.encode_to_vec()
        );
    }

    #[test]
    fn a_parser_reads_the_request_whole_with_each_sub_path_on_its_mount() {
        let req = request();
        let subs: ImageSubPaths = [("/data".to_string(), "dir/sub".to_string())].into();
        let wire = encode_create_container(&req, &subs);
        assert_ne!(wire, req.encode_to_vec());
        // The bindings read every field of the request, the mounts in order.
        let read = cri::CreateContainerRequest::decode(&wire[..]).unwrap();
        assert_eq!(read, req);
        // The newer field is on the mount it was meant for, and only there.
        let view = CreateContainerMounts::decode(&wire[..]).unwrap();
        let mounts = view.config.unwrap().mounts;
        let subs: Vec<String> = mounts
            .iter()
            .map(|m| MountExtension::decode(&m[..]).unwrap().image_sub_path)
            .collect();
        assert_eq!(subs, ["", "dir/sub", ""]);
    }
}

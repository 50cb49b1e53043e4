//! tonic codecs that move the request as raw bytes, so that neither the generator nor the
//! sink pays for a prost encode or decode of the (large) request.

use bytes::{Buf, BufMut, Bytes};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// The gRPC path of the OTLP trace export call.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// The gRPC service name of OTLP traces.
pub const TRACE_SERVICE: &str = "opentelemetry.proto.collector.trace.v1.TraceService";

/// Writes raw bytes.
pub struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

/// Reads raw bytes.
pub struct BytesDecoder;

impl Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Writes or reads an `ExportTraceServiceResponse`.
pub struct ResponseCodec;

impl Encoder for ResponseCodec {
    type Item = ExportTraceServiceResponse;
    type Error = Status;

    fn encode(&mut self, item: ExportTraceServiceResponse, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|e| Status::internal(format!("encoding the response: {e}")))
    }
}

impl Decoder for ResponseCodec {
    type Item = ExportTraceServiceResponse;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<ExportTraceServiceResponse>, Status> {
        ExportTraceServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("decoding the response: {e}")))
    }
}

/// Client side: raw request bytes out, response decoded.
pub struct ClientCodec;

impl Codec for ClientCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = BytesEncoder;
    type Decoder = ResponseCodec;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> ResponseCodec {
        ResponseCodec
    }
}

/// Server side: raw request bytes in, response encoded.
pub struct ServerCodec;

impl Codec for ServerCodec {
    type Encode = ExportTraceServiceResponse;
    type Decode = Bytes;
    type Encoder = ResponseCodec;
    type Decoder = BytesDecoder;

    fn encoder(&mut self) -> ResponseCodec {
        ResponseCodec
    }

    fn decoder(&mut self) -> BytesDecoder {
        BytesDecoder
    }
}

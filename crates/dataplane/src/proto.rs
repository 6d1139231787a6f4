//! The few pieces of protobuf wire format the project's ONNX writers need (the tiny
//! decoder of [`crate::llm`], the serving benchmark's trivial model): varints,
//! length-delimited fields (strings, bytes, packed floats, sub-messages) and 32-bit
//! floats. Field numbers are those of `onnx.proto`; each writer names them where it
//! uses them.

/// Wire type of varint fields.
const VARINT: u64 = 0;
/// Wire type of strings, bytes and sub-messages.
const LENGTH_DELIMITED: u64 = 2;
/// Wire type of 32-bit fields (floats).
const FIXED32: u64 = 5;

/// A protobuf message being written, built field by field.
#[derive(Debug, Default, Clone)]
pub struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn key(&mut self, field: u64, wire: u64) {
        self.varint(field << 3 | wire);
    }

    /// A varint field (negative values as ten-byte two's complement, as `int64` is).
    pub fn int(mut self, field: u64, value: i64) -> Self {
        self.key(field, VARINT);
        self.varint(value as u64);
        self
    }

    /// A `float` field.
    pub fn float(mut self, field: u64, value: f32) -> Self {
        self.key(field, FIXED32);
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// A `bytes` field.
    pub fn bytes(mut self, field: u64, bytes: &[u8]) -> Self {
        self.key(field, LENGTH_DELIMITED);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
        self
    }

    /// A `string` field.
    pub fn string(self, field: u64, text: &str) -> Self {
        self.bytes(field, text.as_bytes())
    }

    /// A sub-message field.
    pub fn message(self, field: u64, message: &Message) -> Self {
        self.bytes(field, &message.0)
    }

    /// A packed `repeated float` field.
    pub fn packed_floats(self, field: u64, values: &[f32]) -> Self {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.bytes(field, &bytes)
    }

    /// The encoded bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    /// The encoded bytes so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_encoded_as_protobuf_does() {
        assert_eq!(Message::default().int(1, 300).0, [0x08, 0xAC, 0x02]);
        assert_eq!(Message::default().string(2, "ab").0, [0x12, 0x02, b'a', b'b']);
        assert_eq!(Message::default().float(2, 1.0).0, [0x15, 0x00, 0x00, 0x80, 0x3F]);
        let minus_one = Message::default().int(3, -1).0;
        assert_eq!(minus_one.len(), 11, "int64 -1 is a ten-byte varint after its key");
        assert_eq!(minus_one[10], 0x01);
    }
}

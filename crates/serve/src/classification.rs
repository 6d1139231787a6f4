//! Triton's classification extension: an output asked for with the `classification`
//! parameter (`class_count: K`) is answered with its top K classes instead of its
//! values, as BYTES `"score:index"` or `"score:index:label"` (the label from the
//! output's `label_filename`, one label per line, line *i* naming class *i*).
//!
//! Scores are written as Triton writes them (six decimals); classes are ordered by
//! score, highest first, a tie going to the lower index. A model that batches answers
//! `[batch, K]` (each item classified on its own); one without a batch dimension
//! answers `[K]` over all of the output's elements. K larger than the number of classes
//! gives every class. Any numeric output can be classified; BYTES cannot.

use super::kserve::{DataType, Tensor, TensorData};

/// The request parameter of an output that asks for its top classes.
pub const PARAMETER: &str = "classification";

/// Labels of an output's classes, by index.
pub type Labels = std::sync::Arc<Vec<String>>;

/// Read a labels file: one label per line (a trailing empty line ignored).
pub fn read_labels(path: &std::path::Path) -> Result<Labels, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("labels file {}: {e}", path.display()))?;
    Ok(std::sync::Arc::new(text.lines().map(|l| l.trim_end_matches('\r').to_string()).collect()))
}

/// `tensor`'s top `class_count` classes per item (`batching`: its first dimension is
/// the batch), as Triton's classification extension answers them.
pub fn classify(tensor: &Tensor, class_count: u32, labels: Option<&[String]>, batching: bool) -> Result<Tensor, String> {
    let values = numeric(tensor)?;
    let items = if batching { tensor.shape.first().copied().unwrap_or(1) as usize } else { 1 };
    let per_item = values.len().checked_div(items).unwrap_or(0);
    let k = (class_count as usize).min(per_item);
    let mut strings = Vec::with_capacity(items * k);
    for item in values.chunks(per_item.max(1)).take(items) {
        let mut order: Vec<usize> = (0..item.len()).collect();
        // Highest first; NaN last; ties to the lower index (the sort is stable).
        order.sort_by(|&a, &b| item[b].partial_cmp(&item[a]).unwrap_or_else(|| item[a].is_nan().cmp(&item[b].is_nan())));
        for &index in &order[..k] {
            let mut text = format!("{:.6}:{index}", item[index]);
            if let Some(label) = labels.and_then(|l| l.get(index)) {
                text.push(':');
                text.push_str(label);
            }
            strings.push(text.into_bytes());
        }
    }
    let shape = if batching { vec![items as u64, k as u64] } else { vec![k as u64] };
    Ok(Tensor { name: tensor.name.clone(), datatype: DataType::Bytes, shape, data: TensorData::Strings(strings) })
}

/// A numeric tensor's elements as `f64` (exact for every type but the 64-bit integers
/// beyond 2^53, which only order classes).
fn numeric(tensor: &Tensor) -> Result<Vec<f64>, String> {
    let TensorData::Raw(bytes) = &tensor.data else {
        return Err(format!("output {:?} is BYTES: only numeric outputs can be classified", tensor.name));
    };
    let width = tensor.datatype.width().unwrap_or(1);
    let value = |c: &[u8]| -> f64 {
        match tensor.datatype {
            DataType::F32 => f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64,
            DataType::F64 => f64::from_le_bytes(c.try_into().expect("8 bytes")),
            DataType::F16 => half::f16::from_le_bytes(c.try_into().expect("2 bytes")).to_f64(),
            DataType::Bf16 => half::bf16::from_le_bytes(c.try_into().expect("2 bytes")).to_f64(),
            DataType::I8 => c[0] as i8 as f64,
            DataType::U8 | DataType::Bool => c[0] as f64,
            DataType::I16 => i16::from_le_bytes(c.try_into().expect("2 bytes")) as f64,
            DataType::U16 => u16::from_le_bytes(c.try_into().expect("2 bytes")) as f64,
            DataType::I32 => i32::from_le_bytes(c.try_into().expect("4 bytes")) as f64,
            DataType::U32 => u32::from_le_bytes(c.try_into().expect("4 bytes")) as f64,
            DataType::I64 => i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64,
            DataType::U64 => u64::from_le_bytes(c.try_into().expect("8 bytes")) as f64,
            DataType::Bytes => unreachable!("BYTES has no raw elements"),
        }
    };
    Ok(bytes.chunks_exact(width).map(value).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scores(shape: Vec<u64>, values: &[f32]) -> Tensor {
        Tensor::f32("probs", shape, values).unwrap()
    }

    fn strings(tensor: &Tensor) -> Vec<String> {
        match &tensor.data {
            TensorData::Strings(items) => items.iter().map(|s| String::from_utf8(s.clone()).unwrap()).collect(),
            TensorData::Raw(_) => panic!("not BYTES"),
        }
    }

    #[test]
    fn the_top_classes_of_each_item_with_their_labels() {
        let labels: Vec<String> = ["cat", "dog", "fox"].iter().map(|s| s.to_string()).collect();
        let out = classify(&scores(vec![2, 3], &[0.1, 0.7, 0.2, 0.5, 0.25, 0.25]), 2, Some(&labels), true).unwrap();
        assert_eq!((out.datatype, out.shape.clone()), (DataType::Bytes, vec![2, 2]));
        assert_eq!(
            strings(&out),
            ["0.700000:1:dog", "0.200000:2:fox", "0.500000:0:cat", "0.250000:1:dog"],
            "a tie goes to the lower index"
        );
    }

    #[test]
    fn without_labels_or_a_batch_and_past_the_class_count() {
        let out = classify(&scores(vec![3], &[3.0, -1.0, 9.5]), 5, None, false).unwrap();
        assert_eq!(out.shape, vec![3], "K beyond the classes gives every class");
        assert_eq!(strings(&out), ["9.500000:2", "3.000000:0", "-1.000000:1"]);
        let ints = Tensor::raw("n", DataType::I64, vec![1, 2], [5i64, 8].iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap();
        assert_eq!(strings(&classify(&ints, 1, None, true).unwrap()), ["8.000000:1"]);
        let text = Tensor { name: "t".into(), datatype: DataType::Bytes, shape: vec![1], data: TensorData::Strings(vec![b"x".to_vec()]) };
        assert!(classify(&text, 1, None, false).unwrap_err().contains("only numeric outputs"));
    }
}

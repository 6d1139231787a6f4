//! The PP-OCR stages on real models (CPU): each stage alone, then the whole pipeline
//! from a rendered image to its text.

use crate::common;

use std::time::Instant;

use yardmaster_dataplane::ocr::{OcrModels, OcrPipeline};

fn pipeline() -> OcrPipeline {
    let runtime = common::runtime();
    let models = OcrModels::from_assets().unwrap_or_else(|e| panic!("{e}"));
    OcrPipeline::load(&runtime, &common::cache(), &models, 0).unwrap()
}

fn normalised(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_uppercase()
}

#[test]
fn detection_finds_one_box_per_rendered_line() {
    let mut ocr = pipeline();
    let image = common::render(&["YARDMASTER 2026", "ONNX RUNTIME"], 40.0, 736, 736, 60.0, 200.0);
    let boxes = ocr.detect(&image).unwrap();
    assert_eq!(boxes.len(), 2, "{boxes:?}");
    // Reading order, and each box covers its line's band.
    for (i, b) in boxes.iter().enumerate() {
        let top = 200.0 + i as f32 * 72.0;
        let (ys, xs): (Vec<f32>, Vec<f32>) = b.corners.iter().map(|p| (p.1, p.0)).unzip();
        let (y0, y1) = (ys.iter().cloned().fold(f32::MAX, f32::min), ys.iter().cloned().fold(f32::MIN, f32::max));
        assert!(y0 < top + 15.0 && y1 > top + 30.0 && y1 < top + 70.0, "box {i}: {b:?}");
        assert!(xs.iter().cloned().fold(f32::MAX, f32::min) < 70.0, "box {i} starts at the text: {b:?}");
        assert!(b.score > 0.5);
    }
    assert!(boxes[0].corners[1].0 > boxes[1].corners[1].0, "the first line is the longer one");
}

#[test]
fn classification_turns_upside_down_crops() {
    let mut ocr = pipeline();
    let upright = common::render(&["Upside down text"], 32.0, 360, 48, 8.0, 2.0);
    let mut crops = vec![upright.clone(), upright.rotate_180()];
    let directions = ocr.classify(&mut crops).unwrap();
    assert_eq!(directions[0].angle, 0, "{directions:?}");
    assert_eq!(directions[1].angle, 180, "{directions:?}");
    assert!(directions[1].score >= 0.9);
    assert_eq!(crops[1], upright, "the upside-down crop is turned back");
}

#[test]
fn recognition_reads_rendered_crops() {
    let mut ocr = pipeline();
    let words = ["Hello world", "PP-OCR 42", "batch of three"];
    let crops: Vec<_> = words.iter().map(|w| common::render(&[w], 32.0, 20 + w.len() * 22, 48, 8.0, 2.0)).collect();
    let read = ocr.recognize(&crops).unwrap();
    for (word, r) in words.iter().zip(&read) {
        assert_eq!(normalised(&r.text), normalised(word), "{read:?}");
        assert!(r.score > 0.8, "{r:?}");
    }
}

#[test]
fn the_pipeline_reads_text_from_an_image() {
    let mut ocr = pipeline();
    let lines = ["INVOICE 2026-11", "Total due 1234", "Thank you"];
    let image = common::render(&lines, 36.0, 736, 736, 50.0, 150.0);
    let begin = Instant::now();
    let found = ocr.run(&image).unwrap();
    eprintln!("pipeline: {:?} for {} lines", begin.elapsed(), found.len());
    let texts: Vec<String> = found.iter().map(|l| normalised(&l.text)).collect();
    let expected: Vec<String> = lines.iter().map(|l| normalised(l)).collect();
    assert_eq!(texts, expected, "{found:?}");
}

#[test]
fn an_upside_down_image_is_read_after_turning_its_lines() {
    let mut ocr = pipeline();
    let image = common::render(&["Rotated label 77"], 40.0, 736, 736, 80.0, 300.0).rotate_180();
    let found = ocr.run(&image).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].direction.angle, 180);
    assert_eq!(normalised(&found[0].text), normalised("Rotated label 77"));
}

//! Geometry for the detection post-processing: connected regions of a bitmap, convex
//! hulls, minimum-area rectangles, and polygon means over a map.

use super::image::Point;

/// One 8-connected region of set pixels: for each row it covers, its leftmost and
/// rightmost column (enough for its convex hull), and its pixel count.
#[derive(Debug, Clone, PartialEq)]
pub struct Region {
    /// `(y, x_min, x_max)` per covered row.
    pub rows: Vec<(usize, usize, usize)>,
    /// Number of pixels.
    pub pixels: usize,
}

/// The 8-connected regions of `bitmap` (`width` × `height`, row-major).
pub fn regions(bitmap: &[bool], width: usize, height: usize) -> Vec<Region> {
    let mut label = vec![u32::MAX; bitmap.len()];
    let mut out = Vec::new();
    let mut stack = Vec::new();
    for start in 0..bitmap.len() {
        if !bitmap[start] || label[start] != u32::MAX {
            continue;
        }
        let id = out.len() as u32;
        label[start] = id;
        stack.push(start);
        let mut extent: std::collections::BTreeMap<usize, (usize, usize)> = std::collections::BTreeMap::new();
        let mut pixels = 0;
        while let Some(i) = stack.pop() {
            let (x, y) = (i % width, i / width);
            pixels += 1;
            let e = extent.entry(y).or_insert((x, x));
            e.0 = e.0.min(x);
            e.1 = e.1.max(x);
            for dy in -1i64..=1 {
                for dx in -1i64..=1 {
                    let (nx, ny) = (x as i64 + dx, y as i64 + dy);
                    if nx < 0 || ny < 0 || nx >= width as i64 || ny >= height as i64 {
                        continue;
                    }
                    let j = ny as usize * width + nx as usize;
                    if bitmap[j] && label[j] == u32::MAX {
                        label[j] = id;
                        stack.push(j);
                    }
                }
            }
        }
        out.push(Region { rows: extent.into_iter().map(|(y, (a, b))| (y, a, b)).collect(), pixels });
    }
    out
}

/// The convex hull of `points` (counter-clockwise in image coordinates, no repeats).
pub fn convex_hull(points: &[Point]) -> Vec<Point> {
    let mut pts: Vec<Point> = points.to_vec();
    pts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    pts.dedup();
    if pts.len() < 3 {
        return pts;
    }
    let cross = |o: Point, a: Point, b: Point| (a.0 - o.0) * (b.1 - o.1) - (a.1 - o.1) * (b.0 - o.0);
    let mut hull: Vec<Point> = Vec::with_capacity(pts.len() * 2);
    for pass in 0..2 {
        let start = hull.len();
        let iter: Box<dyn Iterator<Item = &Point>> = if pass == 0 { Box::new(pts.iter()) } else { Box::new(pts.iter().rev()) };
        for &p in iter {
            while hull.len() >= start + 2 && cross(hull[hull.len() - 2], hull[hull.len() - 1], p) <= 0.0 {
                hull.pop();
            }
            hull.push(p);
        }
        hull.pop();
    }
    hull
}

/// A rotated rectangle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotatedRect {
    /// Centre.
    pub center: Point,
    /// Side along `axis`.
    pub width: f32,
    /// Side across `axis`.
    pub height: f32,
    /// Unit vector of the `width` side.
    pub axis: Point,
}

impl RotatedRect {
    /// The shorter side.
    pub fn short_side(&self) -> f32 {
        self.width.min(self.height)
    }

    /// Grown by `d` on every side.
    pub fn expanded(&self, d: f32) -> RotatedRect {
        RotatedRect { width: self.width + 2.0 * d, height: self.height + 2.0 * d, ..*self }
    }

    /// Corners ordered top-left, top-right, bottom-right, bottom-left.
    pub fn corners(&self) -> [Point; 4] {
        let (ux, uy) = self.axis;
        let (vx, vy) = (-uy, ux);
        let (hw, hh) = (self.width / 2.0, self.height / 2.0);
        let (cx, cy) = self.center;
        let pts = [
            (cx - ux * hw - vx * hh, cy - uy * hw - vy * hh),
            (cx + ux * hw - vx * hh, cy + uy * hw - vy * hh),
            (cx + ux * hw + vx * hh, cy + uy * hw + vy * hh),
            (cx - ux * hw + vx * hh, cy - uy * hw + vy * hh),
        ];
        order_corners(pts)
    }
}

/// Order four corners top-left, top-right, bottom-right, bottom-left: the two leftmost
/// are the left side (upper one first), the other two the right side.
pub fn order_corners(mut pts: [Point; 4]) -> [Point; 4] {
    pts.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let (left, right) = pts.split_at(2);
    let (tl, bl) = if left[0].1 <= left[1].1 { (left[0], left[1]) } else { (left[1], left[0]) };
    let (tr, br) = if right[0].1 <= right[1].1 { (right[0], right[1]) } else { (right[1], right[0]) };
    [tl, tr, br, bl]
}

/// The minimum-area rectangle around `points` (rotating calipers over their hull).
pub fn min_area_rect(points: &[Point]) -> RotatedRect {
    let hull = convex_hull(points);
    if hull.len() < 3 {
        let (a, b) = (hull[0], *hull.last().unwrap());
        let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
        let axis = if len > 0.0 { ((b.0 - a.0) / len, (b.1 - a.1) / len) } else { (1.0, 0.0) };
        return RotatedRect { center: ((a.0 + b.0) / 2.0, (a.1 + b.1) / 2.0), width: len, height: 0.0, axis };
    }
    let mut best: Option<(f32, RotatedRect)> = None;
    for i in 0..hull.len() {
        let (a, b) = (hull[i], hull[(i + 1) % hull.len()]);
        let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
        if len == 0.0 {
            continue;
        }
        let u = ((b.0 - a.0) / len, (b.1 - a.1) / len);
        let v = (-u.1, u.0);
        let (mut u_min, mut u_max, mut v_min, mut v_max) = (f32::MAX, f32::MIN, f32::MAX, f32::MIN);
        for p in &hull {
            let pu = p.0 * u.0 + p.1 * u.1;
            let pv = p.0 * v.0 + p.1 * v.1;
            u_min = u_min.min(pu);
            u_max = u_max.max(pu);
            v_min = v_min.min(pv);
            v_max = v_max.max(pv);
        }
        let area = (u_max - u_min) * (v_max - v_min);
        if best.as_ref().is_none_or(|(a, _)| area < *a) {
            let (cu, cv) = ((u_min + u_max) / 2.0, (v_min + v_max) / 2.0);
            // Prefer the axis closest to horizontal for the width side.
            let (axis, width, height) = if u.0.abs() >= u.1.abs() {
                (if u.0 < 0.0 { (-u.0, -u.1) } else { u }, u_max - u_min, v_max - v_min)
            } else {
                (if v.0 < 0.0 { (-v.0, -v.1) } else { v }, v_max - v_min, u_max - u_min)
            };
            let center = (cu * u.0 + cv * v.0, cu * u.1 + cv * v.1);
            best = Some((area, RotatedRect { center, width, height, axis }));
        }
    }
    best.map(|(_, r)| r).expect("a hull of three points has an edge")
}

/// Whether `p` lies inside the convex polygon `poly` (either orientation).
pub fn inside_convex(poly: &[Point], p: Point) -> bool {
    let mut sign = 0.0f32;
    for i in 0..poly.len() {
        let (a, b) = (poly[i], poly[(i + 1) % poly.len()]);
        let c = (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0);
        if c != 0.0 {
            if sign != 0.0 && c.signum() != sign {
                return false;
            }
            sign = c.signum();
        }
    }
    true
}

/// Mean of `map` (`width` × `height`) over the pixels whose centres lie in the convex
/// polygon `poly`.
pub fn mean_inside(map: &[f32], width: usize, height: usize, poly: &[Point]) -> f32 {
    let x0 = poly.iter().map(|p| p.0).fold(f32::MAX, f32::min).floor().max(0.0) as usize;
    let x1 = (poly.iter().map(|p| p.0).fold(f32::MIN, f32::max).ceil() as usize).min(width.saturating_sub(1));
    let y0 = poly.iter().map(|p| p.1).fold(f32::MAX, f32::min).floor().max(0.0) as usize;
    let y1 = (poly.iter().map(|p| p.1).fold(f32::MIN, f32::max).ceil() as usize).min(height.saturating_sub(1));
    let (mut sum, mut count) = (0.0f32, 0usize);
    for y in y0..=y1 {
        for x in x0..=x1 {
            if inside_convex(poly, (x as f32, y as f32)) {
                sum += map[y * width + x];
                count += 1;
            }
        }
    }
    if count == 0 {
        0.0
    } else {
        sum / count as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_hulls_and_rectangles() {
        // Two blobs: a 4×2 bar and a single pixel.
        let (w, h) = (8, 5);
        let mut bitmap = vec![false; w * h];
        for y in 1..3 {
            for x in 1..5 {
                bitmap[y * w + x] = true;
            }
        }
        bitmap[4 * w + 7] = true;
        let found = regions(&bitmap, w, h);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].pixels, 8);
        assert_eq!(found[0].rows, vec![(1, 1, 4), (2, 1, 4)]);
        let points: Vec<Point> = found[0].rows.iter().flat_map(|&(y, a, b)| [(a as f32, y as f32), (b as f32, y as f32)]).collect();
        let rect = min_area_rect(&points);
        assert!((rect.width - 3.0).abs() < 1e-5 && (rect.height - 1.0).abs() < 1e-5, "{rect:?}");
        assert_eq!(rect.corners(), [(1.0, 1.0), (4.0, 1.0), (4.0, 2.0), (1.0, 2.0)]);
    }

    #[test]
    fn a_rotated_square_has_its_own_side_as_minimum_rectangle() {
        let diamond = [(0.0, 1.0), (1.0, 0.0), (2.0, 1.0), (1.0, 2.0)];
        let rect = min_area_rect(&diamond);
        assert!((rect.width * rect.height - 2.0).abs() < 1e-4, "{rect:?}");
        let map = vec![1.0f32; 9];
        assert_eq!(mean_inside(&map, 3, 3, &diamond), 1.0);
    }
}

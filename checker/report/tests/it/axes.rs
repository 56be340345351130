//! The histograms' axes name and scale the right quantities: under each bar
//! the key it counts, up the side the count, and each bar as tall as its
//! count on that scale.

use std::collections::BTreeMap;

/// One `<text>` of plotters' SVG: where it stands, how it is anchored, and
/// whether it is turned (the y axis' description).
#[derive(Debug, Clone)]
struct Label {
    x: f64,
    y: f64,
    anchor: String,
    dy: String,
    turned: bool,
    text: String,
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&tag[start..start + tag[start..].find('"')?])
}

fn labels(svg: &str) -> Vec<Label> {
    svg.split("<text")
        .skip(1)
        .map(|t| {
            let (tag, rest) = t.split_once('>').unwrap();
            Label {
                x: attr(tag, "x").unwrap().parse().unwrap(),
                y: attr(tag, "y").unwrap().parse().unwrap(),
                anchor: attr(tag, "text-anchor").unwrap().to_owned(),
                dy: attr(tag, "dy").unwrap().to_owned(),
                turned: attr(tag, "transform").is_some(),
                text: rest.split_once("</text>").unwrap().0.trim().to_owned(),
            }
        })
        .collect()
}

/// Every filled bar: (left, top, width, height).
fn bars(svg: &str, fill: &str) -> Vec<(f64, f64, f64, f64)> {
    svg.split("<rect")
        .skip(1)
        .map(|t| t.split_once("/>").unwrap().0)
        .filter(|tag| attr(tag, "fill") == Some(fill))
        .map(|tag| {
            let n = |name| attr(tag, name).unwrap().parse::<f64>().unwrap();
            (n("x"), n("y"), n("width"), n("height"))
        })
        .collect()
}

/// Checks the axes of a histogram of `counts` drawn with `x_desc` and `y_desc`.
fn assert_axes(svg: &str, counts: &BTreeMap<u32, u64>, x_desc: &str, y_desc: &str) {
    let labels = labels(svg);
    // The descriptions: the turned one up the side, the lowest one under the x axis.
    let turned: Vec<&str> = labels.iter().filter(|l| l.turned).map(|l| l.text.as_str()).collect();
    assert_eq!(turned, [y_desc], "the y axis counts {y_desc}");
    let lowest = labels.iter().filter(|l| !l.turned).max_by(|a, b| a.y.total_cmp(&b.y)).unwrap();
    assert_eq!(lowest.text, x_desc, "the x axis counts {x_desc}");

    // Under the bars, left to right: each key once.
    let mut under: Vec<&Label> =
        labels.iter().filter(|l| !l.turned && l.anchor == "middle" && l.dy == "0.76em").collect();
    under.sort_by(|a, b| a.x.total_cmp(&b.x));
    let keys: Vec<String> = counts.keys().map(u32::to_string).collect();
    assert_eq!(under.iter().map(|l| l.text.clone()).collect::<Vec<_>>(), keys, "one label per bar, its key");

    // The y scale, from its labels: pixels per unit of count.
    let ticks: Vec<(f64, f64)> =
        labels.iter().filter(|l| l.anchor == "end").map(|l| (l.text.parse::<f64>().unwrap(), l.y)).collect();
    assert!(ticks.len() >= 2, "{ticks:?}");
    let (v0, y0) = ticks[0];
    let (v1, y1) = ticks[ticks.len() - 1];
    let px_per_unit = (y0 - y1) / (v1 - v0);
    assert!(px_per_unit > 0.0, "counts go up: {ticks:?}");

    // Each bar stands over its key's label and is as tall as its count.
    let drawn = bars(svg, "#5C6BC0");
    assert_eq!(drawn.len(), counts.len());
    for ((key, count), ((left, top, width, height), label)) in counts.iter().zip(drawn.iter().zip(&under)) {
        let centre = left + width / 2.0;
        assert!((centre - label.x).abs() <= 2.0, "bar of {key} at {centre}, its label at {}", label.x);
        let want = *count as f64 * px_per_unit;
        assert!((height - want).abs() <= 2.0, "bar of {key} ({count}) is {height} px, the scale says {want}");
        // The axis' zero is where every bar starts.
        assert!((top + height - (y0 + v0 * px_per_unit)).abs() <= 2.0, "bar of {key} does not start at 0");
    }
    // And the count is written over each bar.
    let over: Vec<String> =
        labels.iter().filter(|l| l.dy == "-0.5ex" && !l.turned && l.text != x_desc).map(|l| l.text.clone()).collect();
    assert_eq!(over, counts.values().map(u64::to_string).collect::<Vec<_>>());
}

#[test]
fn the_delivery_histogram_counts_applications_by_delivery_attempt() {
    let counts: BTreeMap<u32, u64> = [(1, 900), (2, 80), (3, 5), (7, 1)].into_iter().collect();
    let svg = haunt_report::plots::histogram(&counts, "delivery attempt", "applications").unwrap();
    assert_axes(&svg, &counts, "delivery attempt", "applications");
}

#[test]
fn the_report_labels_both_delivery_histograms() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../check/tests/runs/delivery-evidence-in-windows");
    let results = haunt_checker::check_dir(&dir).unwrap();
    let html = haunt_report::render(&results, &haunt_report::RunInfo::default());
    let svg_of = |label: &str| -> String {
        let start = html.find(&format!(r#"aria-label="{label}">"#)).unwrap_or_else(|| panic!("no plot {label}"));
        html[start..start + html[start..].find("</figure>").unwrap()].to_owned()
    };
    // Applications: attempt 1 four times, 2 and 3 once each (e4's second
    // application, e2's on its third delivery).
    let by_attempt: BTreeMap<u32, u64> = [(1, 4), (2, 1), (3, 1)].into_iter().collect();
    assert_eq!(results.delivery.histogram, by_attempt);
    assert_axes(&svg_of("applications by delivery attempt"), &by_attempt, "delivery attempt", "applications");
    // Events: e6 never delivered, three delivered once, e4 twice, e2 three times.
    let by_deliveries: BTreeMap<u32, u64> = [(0, 1), (1, 3), (2, 1), (3, 1)].into_iter().collect();
    assert_axes(&svg_of("events by their number of deliveries"), &by_deliveries, "deliveries of the event", "events");
}

//! `python.map` stages: identity is byte-identical to the pipeline without it (element-wise and
//! batched), random functions are reproducible across runs and thread counts, fields come back
//! added, replaced and dropped, failures name the stage, the element and the traceback, and a
//! stage that waits gets more compute threads from the tuner with the same batches.
//!
//! They need a Python with NumPy: `GRANARY_PYTHON`, else `python3` on PATH. Under CI
//! (`CI=true`) a missing one fails the tests; elsewhere they are skipped with a message.

mod support;

use granary_worker::ops::python::Interpreter;
use granary_worker::{Batch, Engine, EngineOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::dataset;

/// The interpreter the tests use, or `None` (skip) when there is none with NumPy outside CI.
fn python() -> Option<PathBuf> {
    let found = Interpreter::find(None).ok().filter(|i| {
        Command::new(&i.path).args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success())
    });
    match found {
        Some(i) => Some(i.path),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("no Python with NumPy: set GRANARY_PYTHON (scripts/test makes one)")
        }
        None => {
            eprintln!("skipped: no Python with NumPy (set GRANARY_PYTHON)");
            None
        }
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python")
}

/// The training recipe on `memory://NAME/`, with `extra` (YAML stage lines) after the flip.
fn manifest(name: &str, extra: &str, batch: usize) -> granary_crds::Manifest {
    manifest_with(name, extra, batch, "")
}

/// [`manifest`] with `spec` (YAML lines of `spec`) added.
fn manifest_with(name: &str, extra: &str, batch: usize, spec: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: test}}
spec:
  source: {{url: "memory://{name}/data/train/", format: files, labels: ../labels.jsonl, filesPerSplit: 8}}
  stages:
    - op: image.decode
    - op: image.random_resized_crop
      size: 16
    - op: image.flip
{extra}
  shuffle: {{buffer: 10}}
  batch: {{size: {batch}}}
  seed: 11
  epochs: 1
{spec}
"#
    );
    granary_crds::parse_manifest(&text, &fixtures(), &[]).unwrap()
}

fn open(manifest: &granary_crds::Manifest, threads: usize, python: &Path) -> Engine {
    let options = EngineOptions {
        threads,
        prefetch_bytes: 1 << 20,
        python: Some(python.to_path_buf()),
        ..Default::default()
    };
    Engine::open(manifest, options).unwrap_or_else(|e| panic!("{e}"))
}

fn run(manifest: &granary_crds::Manifest, threads: usize, python: &Path) -> Vec<Batch> {
    let engine = open(manifest, threads, python);
    engine.run_epoch(0).collect::<Result<Vec<_>, _>>().unwrap_or_else(|e| panic!("{e}"))
}

fn error_of(manifest: &granary_crds::Manifest, python: &Path) -> String {
    let engine = open(manifest, 2, python);
    match engine.run_epoch(0).collect::<Result<Vec<_>, _>>() {
        Ok(_) => panic!("the run should fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn identity_gives_the_same_bytes_element_wise_and_batched() {
    let Some(python) = python() else { return };
    dataset("py-identity", 40);
    let plain = run(&manifest("py-identity", "", 8), 2, &python);
    for stage in [
        "    - op: python.map\n      function: stages:identity",
        "    - op: python.map\n      function: stages:identity_batched\n      batched: true",
    ] {
        let with = run(&manifest("py-identity", stage, 8), 2, &python);
        assert_eq!(with, plain, "{stage}");
    }
}

#[test]
fn batched_functions_take_blocks_of_the_batch_size() {
    let Some(python) = python() else { return };
    dataset("py-groups", 20);
    // Splits of 8 elements; batch 3: blocks [0,3), [3,6), [6,8) of each split.
    let stage = "    - op: python.map\n      function: stages:group_size\n      batched: true";
    let batches = run(&manifest("py-groups", stage, 3), 2, &python);
    let mut sizes: Vec<i64> = batches
        .iter()
        .flat_map(|b| bytemuck::cast_slice::<u8, i64>(&b.tensor("group").unwrap().data).to_vec())
        .collect();
    sizes.sort();
    // 20 elements: splits of 8, 8 and 4: blocks of 3, 3, 2 | 3, 3, 2 | 3, 1.
    let expected = [vec![1], vec![2; 4], vec![3; 15]].concat();
    assert_eq!(sizes, expected);
}

#[test]
fn a_random_function_repeats_across_runs_and_thread_counts() {
    let Some(python) = python() else { return };
    dataset("py-random", 40);
    for stage in [
        "    - op: python.map\n      function: stages:jitter\n      args: {strength: 0.3}",
        "    - op: python.map\n      function: stages:jitter_batched\n      batched: true",
    ] {
        let m = manifest("py-random", stage, 8);
        let first = run(&m, 1, &python);
        assert_eq!(run(&m, 2, &python), first, "{stage}");
        assert_eq!(run(&m, 2, &python), first, "{stage}");
        let plain = run(&manifest("py-random", "", 8), 1, &python);
        assert_ne!(first, plain, "the function changed nothing: {stage}");
    }
}

#[test]
fn declared_writes_are_checked_against_the_fields_the_element_had() {
    let Some(python) = python() else { return };
    dataset("py-writes", 20);
    // The functions see every field (`image` and `label`) and return them all: only `image` is
    // written, as declared, element-wise (one call, or gathered) and batched.
    for batch in [1, 4] {
        let plain = run(&manifest("py-writes", "", batch), 2, &python);
        for stage in [
            "    - {op: python.map, function: 'stages:identity', reads: [image], writes: [image]}",
            "    - {op: python.map, function: 'stages:identity_batched', batched: true, reads: [image], writes: [image]}",
        ] {
            let with = run(&manifest("py-writes", stage, batch), 2, &python);
            assert_eq!(with, plain, "{stage}, batch {batch}");
        }
    }
    // A function that adds a field it did not declare fails, naming it.
    let stage = "    - {op: python.map, function: 'stages:add_fields', reads: [image, label], writes: [image, label]}";
    let e = error_of(&manifest("py-writes", stage, 4), &python);
    assert!(e.contains("added field `key_text`") && e.contains("writes"), "{e}");
}

#[test]
fn a_select_moved_before_a_declared_python_stage_gives_the_same_elements() {
    let Some(python) = python() else { return };
    // JSON Lines rows with a label and a large field the select drops.
    let store = granary_worker::store::memory_store("py-select");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for f in 0..2 {
        let rows: String = (f..30)
            .step_by(2)
            .map(|r| format!("{{\"label\": {r}, \"meta\": \"{}\"}}\n", "x".repeat(100 + r)))
            .collect();
        let path = object_store::path::Path::from(format!("data/part-{f}.jsonl"));
        rt.block_on(object_store::ObjectStoreExt::put(&store, &path, bytes::Bytes::from(rows).into()))
            .unwrap();
    }
    for batch in [1, 4] {
        let text = format!(
            "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: t}}\nspec:\n  source: \
             {{url: 'memory://py-select/data/', format: jsonl}}\n  batch: {{size: {batch}}}\n  shuffle: {{buffer: 5}}\n  \
             stages:\n  - {{op: python.map, function: 'stages:label_times_two', deterministic: true, reads: [label], \
             writes: [label]}}\n  - {{op: table.select, columns: [label]}}\n"
        );
        let on = granary_crds::parse_manifest(&text, &fixtures(), &[]).unwrap_or_else(|p| panic!("{p}"));
        let mut off = on.clone();
        off.pipeline.spec.optimize = false;
        let engine = open(&on, 2, &python);
        // The select runs first: `meta` never crosses to the Python process.
        assert_eq!(engine.optimized().origins(), [1, 0], "batch {batch}");
        let optimized = engine.run_epoch(0).collect::<Result<Vec<_>, _>>().unwrap_or_else(|e| panic!("{e}"));
        let written = run(&off, 2, &python);
        assert_eq!(optimized, written, "batch {batch}");
        let mut labels: Vec<i64> = written
            .iter()
            .flat_map(|b| bytemuck::cast_slice::<u8, i64>(&b.tensor("label").unwrap().data).to_vec())
            .collect();
        labels.sort();
        assert_eq!(labels, (0..30).map(|r| 2 * r).collect::<Vec<i64>>());
        assert!(written.iter().all(|b| b.tensor("meta").is_none()));
    }
}

#[test]
fn returned_fields_are_added_replaced_and_dropped() {
    let Some(python) = python() else { return };
    dataset("py-fields", 12);
    let stages = "    - op: python.map\n      function: stages:add_fields\n    - op: python.map\n      function: stages:check_text_and_bytes";
    let m = manifest("py-fields", stages, 4);
    let batches = run(&m, 2, &python);
    let plain = run(&manifest("py-fields", "", 4), 2, &python);
    for (b, p) in batches.iter().zip(&plain) {
        assert!(b.tensor("label").is_none(), "label was dropped");
        assert_eq!(b.tensor("image"), p.tensor("image"), "image went back and forth unchanged");
        let labels: &[i64] = bytemuck::cast_slice(&p.tensor("label").unwrap().data);
        let plus: &[i64] = bytemuck::cast_slice(&b.tensor("label_plus_one").unwrap().data);
        assert_eq!(plus.iter().map(|x| x - 1).collect::<Vec<_>>(), labels);
        let area: &[i64] = bytemuck::cast_slice(&b.tensor("area").unwrap().data);
        assert!(area.iter().all(|&a| a == 16 * 16));
        assert_eq!(b.tensor("checked").unwrap().data, vec![1u8; b.keys.len()], "text and bytes crossed");
        assert_eq!(b.keys, p.keys);
    }
}

#[test]
fn an_exception_names_the_stage_the_element_and_the_traceback() {
    let Some(python) = python() else { return };
    dataset("py-boom", 12);
    let m = manifest("py-boom", "    - op: python.map\n      name: augment\n      function: stages:boom", 4);
    let message = error_of(&m, &python);
    assert!(message.contains("spec.stages[3] (`augment`)"), "{message}");
    assert!(message.contains("failed on element `00003.jpg`"), "{message}");
    assert!(message.contains("Traceback (most recent call last)"), "{message}");
    assert!(message.contains("stages.py"), "{message}");
    assert!(message.contains("ValueError: cannot augment 00003.jpg"), "{message}");
}

#[test]
fn a_crash_in_native_code_is_reported_and_the_runner_replaced() {
    let Some(python) = python() else { return };
    dataset("py-crash", 4);
    let m = manifest("py-crash", "    - op: python.map\n      function: stages:crash", 4);
    let message = error_of(&m, &python);
    assert!(message.contains("the Python process running `stages:crash` died"), "{message}");
    assert!(message.contains("SIGSEGV"), "{message}");
}

#[test]
fn bad_returns_and_imports_say_what_to_fix() {
    let Some(python) = python() else { return };
    dataset("py-bad", 4);
    let m = manifest("py-bad", "    - op: python.map\n      function: stages:not_a_dict", 4);
    let message = error_of(&m, &python);
    assert!(message.contains("`stages:not_a_dict` returned list; return a dict"), "{message}");

    let options = EngineOptions { python: Some(python.clone()), ..Default::default() };
    for (stage, expected) in [
        ("function: nowhere:fn", "cannot import `nowhere`"),
        ("function: stages:missing", "has no `missing`"),
        (
            "function: stages:identity\n      args: {strength: 1}",
            "cannot be called as identity(element, strength=…)",
        ),
    ] {
        let m = manifest("py-bad", &format!("    - op: python.map\n      {stage}"), 4);
        let error = Engine::open(&m, options.clone()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("spec.stages[3].function"), "{error}");
        assert!(error.contains(expected), "{error}");
    }
}

/// Runs epoch 0 split by split: the batches and the sum of the `SplitDone` counts.
fn run_counted(manifest: &granary_crds::Manifest, threads: usize, python: &Path) -> (Vec<Batch>, u64) {
    use granary_worker::executor::{Output, Task};
    let engine = open(manifest, threads, python);
    let tasks: Vec<Task> = engine.split_order(0).into_iter().map(|s| Task::compute(0, s)).collect();
    let (mut batches, mut elements) = (Vec::new(), 0);
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        match output.unwrap_or_else(|e| panic!("{e}")) {
            Output::Batch { batch, .. } => batches.push(batch),
            Output::SplitDone { elements: n, .. } => elements += n,
        }
    }
    (batches, elements)
}

fn keys_of(batches: &[Batch]) -> Vec<String> {
    let mut keys: Vec<String> = batches.iter().flat_map(|b| b.keys.iter().cloned()).collect();
    keys.sort();
    keys
}

#[test]
fn python_filters_keep_what_the_function_keeps_element_wise_and_batched() {
    let Some(python) = python() else { return };
    let labels = dataset("py-filter", 30);
    for (stage, keep) in [
        ("    - op: python.filter\n      function: filter_stages:even_label", 2),
        (
            "    - op: python.filter\n      function: filter_stages:no_multiple_of_three\n      batched: true",
            3,
        ),
    ] {
        let m = manifest("py-filter", stage, 4);
        let expected: Vec<String> = labels
            .iter()
            .filter(|(_, l)| if keep == 2 { *l % 2 == 0 } else { *l % 3 != 0 })
            .map(|(k, _)| k.clone())
            .collect();
        let (first, elements) = run_counted(&m, 1, &python);
        assert_eq!(keys_of(&first), expected, "{stage}");
        assert_eq!(elements, expected.len() as u64, "SplitDone counts what was kept: {stage}");
        let (again, again_elements) = run_counted(&m, 2, &python);
        assert_eq!(again, first, "{stage}");
        assert_eq!(again_elements, elements);
    }
}

#[test]
fn a_random_python_filter_repeats_across_runs_and_thread_counts() {
    let Some(python) = python() else { return };
    dataset("py-coin", 40);
    for stage in [
        "    - op: python.filter\n      function: filter_stages:coin\n      args: {p: 0.5}",
        "    - op: python.filter\n      function: filter_stages:coin_batched\n      batched: true",
    ] {
        let m = manifest("py-coin", stage, 8);
        let (first, elements) = run_counted(&m, 1, &python);
        assert!(elements > 0 && elements < 40, "a fair coin kept {elements} of 40: {stage}");
        for threads in [2, 2] {
            let (again, again_elements) = run_counted(&m, threads, &python);
            assert_eq!(again, first, "{stage}");
            assert_eq!(again_elements, elements, "{stage}");
        }
    }
}

#[test]
fn a_batched_stage_after_a_filter_takes_the_members_left_in_each_block() {
    let Some(python) = python() else { return };
    let labels = dataset("py-filter-groups", 20);
    let stages = "    - op: python.filter\n      function: filter_stages:even_label\n    - op: python.map\n      function: stages:group_size\n      batched: true";
    let m = manifest("py-filter-groups", stages, 3);
    let (batches, _) = run_counted(&m, 2, &python);
    assert_eq!(run_counted(&m, 1, &python).0, batches);
    let mut sizes: Vec<i64> = batches
        .iter()
        .flat_map(|b| bytemuck::cast_slice::<u8, i64>(&b.tensor("group").unwrap().data).to_vec())
        .collect();
    sizes.sort();
    // Splits of 8 files, blocks of 3 indices: each kept element reports how many of its block
    // were kept.
    let kept: Vec<bool> = labels.values().map(|l| l % 2 == 0).collect();
    let mut expected = Vec::new();
    for split in kept.chunks(8) {
        for block in split.chunks(3) {
            let n = block.iter().filter(|k| **k).count() as i64;
            expected.extend(std::iter::repeat_n(n, n as usize));
        }
    }
    expected.sort();
    assert_eq!(sizes, expected);
}

#[test]
fn a_python_filter_that_raises_or_returns_too_few_decisions_names_the_stage_and_element() {
    let Some(python) = python() else { return };
    dataset("py-filter-boom", 12);
    let m = manifest(
        "py-filter-boom",
        "    - op: python.filter\n      name: keep\n      function: filter_stages:boom",
        4,
    );
    let message = error_of(&m, &python);
    assert!(message.contains("spec.stages[3] (`keep`)"), "{message}");
    assert!(message.contains("failed on element `00005.jpg`"), "{message}");
    assert!(message.contains("ValueError: cannot decide on 00005.jpg"), "{message}");

    let m = manifest(
        "py-filter-boom",
        "    - op: python.filter\n      function: filter_stages:too_few\n      batched: true",
        4,
    );
    let message = error_of(&m, &python);
    assert!(message.contains("returned 1 decisions for a group of 4"), "{message}");
}

/// Elements with a small image each, keyed `e0`, `e1`, ….
fn small_images(n: usize) -> Vec<granary_worker::Element> {
    (0..n)
        .map(|i| {
            let mut e = granary_worker::Element::new(format!("e{i}"));
            let pixels: Vec<u8> = (0..4 * 5 * 3).map(|p| (p * 7 + i * 13) as u8).collect();
            let image =
                granary_worker::Tensor::new(vec![4, 5, 3], granary_worker::TensorData::U8(pixels.into()))
                    .unwrap();
            e.set("image", granary_worker::Value::Tensor(image));
            e
        })
        .collect()
}

/// The operator of an element-wise `python.map` of `function` (from the fixtures), with one
/// runner.
fn element_wise_op(function: &str, python: &Path) -> granary_worker::ops::python::PythonOp {
    let call = granary_crds::ops::PythonCall {
        function: function.into(),
        batched: false,
        args: serde_json::Map::new(),
        role: granary_crds::ops::PythonRole::Map,
        writes: None,
    };
    let interpreter = Interpreter::find(Some(python)).unwrap();
    let paths = vec![fixtures().display().to_string()];
    let stages = granary_worker::ops::python::PythonStages::start(interpreter, vec![call.clone()], paths, 1)
        .unwrap_or_else(|e| panic!("{e}"));
    stages.op(&call).unwrap()
}

#[test]
fn a_gathered_call_computes_what_one_call_per_element_does() {
    use granary_worker::ops::Operator;
    use granary_worker::seed::SeededRng;
    let Some(python) = python() else { return };
    let op = element_wise_op("stages:jitter", &python);
    assert!(op.gathers(), "an element-wise function gathers its calls");
    let streams = || (0..5u64).map(|i| SeededRng::for_element(3, 1, 2, i)).collect::<Vec<_>>();

    let mut one_by_one = small_images(5);
    for (e, mut rng) in one_by_one.iter_mut().zip(streams()) {
        op.apply(e, &mut rng).unwrap();
    }
    let mut gathered = small_images(5);
    let mut rngs = streams();
    let mut refs: Vec<&mut SeededRng> = rngs.iter_mut().collect();
    let fates = op.run_each(&mut gathered, &mut refs).unwrap();
    assert_eq!(fates.len(), 5);
    assert_eq!(gathered, one_by_one);
    assert_ne!(gathered[0].get("noise"), gathered[1].get("noise"), "each element has its own stream");
}

#[test]
fn a_gathered_call_that_raises_names_the_element_and_keeps_the_ones_before() {
    use granary_worker::ops::Operator;
    use granary_worker::seed::SeededRng;
    let Some(python) = python() else { return };
    let op = element_wise_op("stages:boom", &python);
    let mut elements = small_images(6);
    for (i, e) in elements.iter_mut().enumerate() {
        e.key = format!("{i}.jpg");
    }
    let mut rngs: Vec<SeededRng> = (0..6).map(|i| SeededRng::for_element(0, 0, 0, i)).collect();
    let mut refs: Vec<&mut SeededRng> = rngs.iter_mut().collect();
    let (at, error) = op.run_each(&mut elements, &mut refs).err().unwrap();
    assert_eq!(at, 3, "{error}");
    assert!(error.0.contains("ValueError: cannot augment 3.jpg"), "{error}");
    // The runner still serves: the next call works.
    let mut rest = small_images(2);
    let mut rngs: Vec<SeededRng> = (0..2).map(|i| SeededRng::for_element(0, 0, 0, i)).collect();
    let mut refs: Vec<&mut SeededRng> = rngs.iter_mut().collect();
    assert_eq!(op.run_each(&mut rest, &mut refs).unwrap().len(), 2);
}

#[test]
fn a_python_stage_that_waits_gets_more_threads_and_gives_the_same_batches() {
    let Some(python) = python() else { return };
    // 400 elements that each wait 10 ms in Python: 2 s on the 2 threads a 1-core engine starts
    // with (one more for the Python stage), long enough for the tuner's half-second periods.
    dataset("py-wait", 400);
    let stage = "    - op: python.map\n      function: stages:wait\n      args: {seconds: 0.01}";
    let engine = open(&manifest("py-wait", stage, 8), 1, &python);
    let mut batches = engine.run_epoch(0);
    let tuned = batches.by_ref().collect::<Result<Vec<_>, _>>().unwrap_or_else(|e| panic!("{e}"));
    let peak = batches.peak_compute_threads();
    assert!(peak > 2, "the tuner added compute threads to a stage that waits: {peak}");
    // Without the optimizer nothing is tuned; the batches are the same.
    let fixed_manifest = manifest_with("py-wait", stage, 8, "  optimize: false");
    let fixed_engine = open(&fixed_manifest, 1, &python);
    let mut fixed_batches = fixed_engine.run_epoch(0);
    let fixed = fixed_batches.by_ref().collect::<Result<Vec<_>, _>>().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fixed_batches.peak_compute_threads(), 2, "spec.optimize: false tunes nothing");
    assert_eq!(tuned, fixed);
}

//! Deterministic synthetic datasets for `granary demo` and the example pipelines.
//!
//! Layout written under the output folder (the images part mirrors `bench/gen_data.py`):
//!
//! ```text
//! images/train/NNNNNNNN.jpg      JPEG q90 RGB, 160..=400 px per side, smooth photo-like content
//! images/labels.jsonl            {"idx": i, "file": "train/NNNNNNNN.jpg", "label": L}
//! images-wds/shard-NNNNNN.tar    the same samples as WebDataset shards of 64: NNNNNNNN.jpg + .cls
//! text/part-NNNN.jsonl           {"id": i, "text": "..."} English-like sentences, 4 files
//! text/tokenizer.json            BERT-style WordPiece trained on that corpus (vocab ≤ 2000)
//! tables/features.parquet        id int64, label int32, f0..f7 float64, category utf8
//! ```
//!
//! Every byte depends only on the options: the same seed gives identical files. Each image
//! draws from its own stream seeded by (seed, index), so images are made in parallel.

use anyhow::Context;
use arrow_array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use image::ExtendedColorType;
use image::codecs::jpeg::JpegEncoder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::fs;
use std::path::Path;
use std::sync::Arc;
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer};
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Model, Tokenizer, TokenizerBuilder};

/// Number of image classes.
const CLASSES: u64 = 1000;
/// Samples per WebDataset shard.
const SHARD_SAMPLES: usize = 64;
/// Number of `text/part-NNNN.jsonl` files.
const TEXT_PARTS: usize = 4;
/// Rows per Parquet row group.
const ROW_GROUP: usize = 1024;
/// Requested WordPiece vocabulary size.
const VOCAB: usize = 2000;
/// JPEG quality, as in `gen_data.py`.
const JPEG_QUALITY: u8 = 90;
/// The tokenizer's special tokens, in id order (`[PAD]` = 0).
const SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
/// Values of the `category` column.
const CATEGORIES: [&str; 5] = ["alpha", "beta", "gamma", "delta", "epsilon"];
/// Classes of the tabular `label` column.
const TABLE_CLASSES: u64 = 10;

/// What to generate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataOptions {
    /// Number of JPEG images (and WebDataset samples).
    pub images: usize,
    /// Number of text records, spread over 4 JSONL files.
    pub text_lines: usize,
    /// Number of Parquet rows.
    pub table_rows: usize,
    /// Seed of every random draw.
    pub seed: u64,
    /// Image sides are 160 to 400 pixels times this (1: ImageNet-like; 6: camera-like photos,
    /// whose decode dominates a pipeline).
    pub image_scale: u32,
}

impl Default for DataOptions {
    fn default() -> DataOptions {
        DataOptions { images: 256, text_lines: 2048, table_rows: 4096, seed: 0, image_scale: 1 }
    }
}

/// What [`generate`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DataSummary {
    /// JPEG files written under `images/train/`.
    pub images: usize,
    /// Bytes of those JPEG files.
    pub image_bytes: u64,
    /// WebDataset shards written under `images-wds/`.
    pub shards: usize,
    /// Bytes of those shards.
    pub shard_bytes: u64,
    /// Text records written under `text/`.
    pub text_lines: usize,
    /// JSONL files written under `text/`.
    pub text_files: usize,
    /// Bytes of those JSONL files.
    pub text_bytes: u64,
    /// Vocabulary size of `text/tokenizer.json`.
    pub vocab_size: usize,
    /// Parquet rows in `tables/features.parquet`.
    pub table_rows: usize,
    /// Parquet row groups.
    pub row_groups: usize,
    /// Bytes of the Parquet file.
    pub table_bytes: u64,
    /// Bytes of every file written.
    pub total_bytes: u64,
}

/// Writes the demo dataset into `dir` (created if missing). Files a previous, larger run left
/// behind under the same names are removed, so that sources list exactly this dataset.
pub fn generate(dir: &Path, opts: &DataOptions) -> anyhow::Result<DataSummary> {
    let mut summary = DataSummary::default();
    write_images(dir, opts, &mut summary)?;
    write_text(dir, opts, &mut summary)?;
    write_table(dir, opts, &mut summary)?;
    Ok(summary)
}

// ------------------------------------------------------------------------------ randomness --

/// SplitMix64 finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stream for `part` (images, text, table) and `index` under `seed`.
fn stream(seed: u64, part: u64, index: u64) -> Draw {
    let s = mix(mix(seed ^ 0x6465_6d6f) ^ mix(part.wrapping_add(0x9e37_79b9_7f4a_7c15)) ^ index);
    Draw(ChaCha8Rng::seed_from_u64(mix(s.wrapping_add(index))))
}

/// The few draws the generator needs, on a seeded ChaCha8 stream.
struct Draw(ChaCha8Rng);

impl Draw {
    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.0.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit();
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A fast generator for per-pixel noise, seeded from this stream.
    fn fast(&mut self) -> XorShift {
        XorShift(self.0.next_u64() | 1)
    }
}

/// xorshift64*: cheap per-pixel noise.
struct XorShift(u64);

impl XorShift {
    /// Roughly normal noise with unit variance (sum of four uniforms).
    fn noise(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let sum: u32 = (0..4).map(|k| ((r >> (16 * k)) & 0xffff) as u32).sum();
        // Four uniforms on [0, 65535]: mean 131070, variance 4 * 65536^2 / 12.
        (sum as f32 - 131_070.0) / 37_837.2
    }
}

// ---------------------------------------------------------------------------------- images --

/// One generated image: its JPEG bytes and label.
struct Sample {
    jpeg: Vec<u8>,
    label: u64,
}

/// Makes image `idx`: smooth multi-octave color noise, a few soft translucent shapes, mild
/// sensor-like noise; JPEG q90.
fn make_image(seed: u64, idx: u64, scale: u32) -> anyhow::Result<Sample> {
    let mut rng = stream(seed, 1, idx);
    let w = rng.range(160, 400) as usize * scale.max(1) as usize;
    let h = rng.range(160, 400) as usize * scale.max(1) as usize;
    let label = rng.below(CLASSES);
    let m = w.max(h) as f32;
    let mut px = vec![0f32; w * h * 3];

    // 1) Smooth value noise: coarse gradients plus finer detail.
    let mut amp = 1.0f32;
    for cells in [2usize, 4, 8, 16] {
        let gw = (cells as f32 * w as f32 / m) as usize + 2;
        let gh = (cells as f32 * h as f32 / m) as usize + 2;
        let grid: Vec<f32> = (0..gw * gh * 3).map(|_| rng.unit() as f32).collect();
        let axis = |n: usize, g: usize| -> Vec<(usize, f32)> {
            (0..n)
                .map(|i| {
                    let u = i as f32 * (g - 1) as f32 / n as f32;
                    let i0 = (u as usize).min(g - 2);
                    let t = u - i0 as f32;
                    (i0, t * t * (3.0 - 2.0 * t))
                })
                .collect()
        };
        let xs = axis(w, gw);
        let ys = axis(h, gh);
        for (y, &(y0, ty)) in ys.iter().enumerate() {
            for (x, &(x0, tx)) in xs.iter().enumerate() {
                for c in 0..3 {
                    let g = |yy: usize, xx: usize| grid[(yy * gw + xx) * 3 + c];
                    let top = g(y0, x0) + (g(y0, x0 + 1) - g(y0, x0)) * tx;
                    let bottom = g(y0 + 1, x0) + (g(y0 + 1, x0 + 1) - g(y0 + 1, x0)) * tx;
                    px[(y * w + x) * 3 + c] += amp * (top + (bottom - top) * ty);
                }
            }
        }
        amp *= 0.55;
    }
    // Stretch each channel to 0..255.
    for c in 0..3 {
        let (lo, hi) =
            px.iter().skip(c).step_by(3).fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let scale = 255.0 / (hi - lo).max(1e-3);
        px.iter_mut().skip(c).step_by(3).for_each(|v| *v = (*v - lo) * scale);
    }

    // 2) Soft translucent shapes ("objects").
    for _ in 0..rng.range(3, 8) {
        let ellipse = rng.chance(0.6);
        let cx = rng.uniform(-0.1, 1.1) as f32 * w as f32;
        let cy = rng.uniform(-0.1, 1.1) as f32 * h as f32;
        let rx = rng.uniform(0.06, 0.35) as f32 * m;
        let ry = rng.uniform(0.06, 0.35) as f32 * m;
        let color = [rng.below(256) as f32, rng.below(256) as f32, rng.below(256) as f32];
        let alpha = rng.uniform(0.35, 0.85) as f32;
        let soft = rng.uniform(1.5, 8.0) as f32;
        let x_lo = (cx - rx - soft).max(0.0) as usize;
        let x_hi = ((cx + rx + soft).max(0.0) as usize).min(w);
        let y_lo = (cy - ry - soft).max(0.0) as usize;
        let y_hi = ((cy + ry + soft).max(0.0) as usize).min(h);
        for y in y_lo..y_hi {
            let dy = y as f32 + 0.5 - cy;
            for x in x_lo..x_hi {
                let dx = x as f32 + 0.5 - cx;
                // Approximate signed distance to the shape's edge, in pixels.
                let sd = if ellipse {
                    (((dx / rx).powi(2) + (dy / ry).powi(2)).sqrt() - 1.0) * rx.min(ry)
                } else {
                    (dx.abs() - rx).max(dy.abs() - ry)
                };
                let cover = (0.5 - sd / soft).clamp(0.0, 1.0) * alpha;
                if cover > 0.0 {
                    let p = &mut px[(y * w + x) * 3..(y * w + x) * 3 + 3];
                    for c in 0..3 {
                        p[c] += (color[c] - p[c]) * cover;
                    }
                }
            }
        }
    }

    // 3) Mild sensor-like noise: shared luminance plus a little per channel.
    let sigma = rng.uniform(2.0, 6.0) as f32;
    let mut fast = rng.fast();
    let mut rgb = Vec::with_capacity(w * h * 3);
    for p in px.chunks_exact(3) {
        let luma = fast.noise() * sigma;
        for &v in p {
            let n = luma + fast.noise() * sigma * 0.4;
            rgb.push((v + n).round().clamp(0.0, 255.0) as u8);
        }
    }

    let mut jpeg = Vec::with_capacity(w * h / 4);
    JpegEncoder::new_with_quality(&mut jpeg, JPEG_QUALITY)
        .encode(&rgb, w as u32, h as u32, ExtendedColorType::Rgb8)
        .with_context(|| format!("encoding demo image {idx}"))?;
    Ok(Sample { jpeg, label })
}

/// Makes images `0..n` on every core; the result is in index order.
fn make_images(seed: u64, n: usize, scale: u32) -> anyhow::Result<Vec<Sample>> {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, 16);
    let chunk = n.div_ceil(threads).max(1);
    let parts: Vec<anyhow::Result<Vec<Sample>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|start| {
                s.spawn(move || {
                    (start..(start + chunk).min(n)).map(|i| make_image(seed, i as u64, scale)).collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("an image thread panicked"))))
            .collect()
    });
    let mut out = Vec::with_capacity(n);
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}

/// Creates `dir` and removes files in it whose names `stale` matches.
fn fresh_dir(dir: &Path, stale: impl Fn(&str) -> bool) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let name = entry.file_name();
        if stale(&name.to_string_lossy()) && entry.file_type().is_ok_and(|t| t.is_file()) {
            fs::remove_file(entry.path())
                .with_context(|| format!("cannot remove stale {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Writes `bytes` to `path`, returning the byte count.
fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<u64> {
    fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(bytes.len() as u64)
}

/// True for `NNNNNNNN.jpg`-like names: a digit stem and the given extension.
fn numbered(name: &str, prefix: &str, ext: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|n| n.strip_suffix(ext))
        .is_some_and(|stem| !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_digit()))
}

/// A tar header as `gen_data.py` writes them: ustar, mode 644, fixed mtime, root owner.
fn tar_header(size: usize) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_size(size as u64);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

fn write_images(dir: &Path, opts: &DataOptions, summary: &mut DataSummary) -> anyhow::Result<()> {
    let train = dir.join("images/train");
    let wds = dir.join("images-wds");
    fresh_dir(&train, |n| numbered(n, "", ".jpg"))?;
    fresh_dir(&wds, |n| numbered(n, "shard-", ".tar"))?;
    let samples = make_images(opts.seed, opts.images, opts.image_scale)?;

    let mut labels = String::new();
    for (i, s) in samples.iter().enumerate() {
        let name = format!("{i:08}.jpg");
        summary.image_bytes += write(&train.join(&name), &s.jpeg)?;
        labels.push_str(&format!("{{\"idx\": {i}, \"file\": \"train/{name}\", \"label\": {}}}\n", s.label));
        summary.images += 1;
    }
    summary.total_bytes += summary.image_bytes;
    summary.total_bytes += write(&dir.join("images/labels.jsonl"), labels.as_bytes())?;

    for (k, shard) in samples.chunks(SHARD_SAMPLES).enumerate() {
        let path = wds.join(format!("shard-{k:06}.tar"));
        let mut tar = tar::Builder::new(Vec::new());
        for (j, s) in shard.iter().enumerate() {
            let i = k * SHARD_SAMPLES + j;
            let cls = s.label.to_string();
            tar.append_data(&mut tar_header(s.jpeg.len()), format!("{i:08}.jpg"), s.jpeg.as_slice())
                .with_context(|| format!("building {}", path.display()))?;
            tar.append_data(&mut tar_header(cls.len()), format!("{i:08}.cls"), cls.as_bytes())
                .with_context(|| format!("building {}", path.display()))?;
        }
        let bytes = tar.into_inner().with_context(|| format!("building {}", path.display()))?;
        summary.shard_bytes += write(&path, &bytes)?;
        summary.shards += 1;
    }
    summary.total_bytes += summary.shard_bytes;
    Ok(())
}

// ------------------------------------------------------------------------------------ text --

/// The corpus vocabulary: common English words, most frequent first (draws favor the front).
const WORDS: &str = "the of and to a in is it you that he was for on are with as his they be at \
one have this from or had by hot word but what some we can out other were all there when up use \
your how said an each she which do their time if will way about many then them write would like \
so these her long make thing see him two has look more day could go come did number sound no most \
people my over know water than call first who may down side been now find any new work part take \
get place made live where after back little only round man year came show every good me give our \
under name very through just form sentence great think say help low line differ turn cause much \
mean before move right boy old too same tell does set three want air well also play small end put \
home read hand port large spell add even land here must big high such follow act why ask men change \
went light kind off need house picture try us again animal point mother world near build self earth \
father head stand own page should country found answer school grow study still learn plant cover \
food sun four between state keep eye never last let thought city tree cross farm hard start might \
story saw far sea draw left late run while press close night real life few north open seem together \
next white children begin got walk example ease paper group always music those both mark often \
letter until mile river car feet care second book carry took science eat room friend began idea fish \
mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual young \
ready above ever red list though feel talk bird soon body dog family direct pose leave song measure \
door product black short numeral class wind question happen complete ship area half rock order fire \
south problem piece told knew pass since top whole king space heard best hour better true during \
hundred five remember step early hold west ground interest reach fast verb sing listen six table \
travel less morning ten simple several vowel toward war lay against pattern slow center love person \
money serve appear road map rain rule govern pull cold notice voice unit power town fine certain fly \
fall lead cry dark machine note wait plan figure star box noun field rest correct able pound done \
beauty drive stood contain front teach week final gave green oh quick develop ocean warm free minute \
strong special mind behind clear tail produce fact street inch multiply nothing course stay wheel \
full force blue object decide surface deep moon island foot system busy test record boat common gold \
possible plane stead dry wonder laugh thousand ago ran check game shape equate miss brought heat snow \
tire bring yes distant fill east paint language among grand ball yet wave drop heart present heavy \
dance engine position arm wide sail material size vary settle speak weight general ice matter circle \
pair include divide syllable felt perhaps pick sudden count square reason length represent art \
subject region energy hunt probable bed brother egg ride cell believe fraction forest sit race \
window store summer train sleep prove lone exercise wall catch mount wish sky board joy winter sat \
written wild instrument kept glass grass cow job edge sign visit past soft fun bright gas weather";

/// A record of 5..=120 words in sentences of 3..=18 words with some commas.
fn make_line(rng: &mut Draw, words: &[&str]) -> String {
    let n = rng.range(5, 120) as usize;
    let mut out = String::with_capacity(n * 6);
    let mut left_in_sentence = 0;
    for k in 0..n {
        if left_in_sentence == 0 {
            left_in_sentence = rng.range(3, 18) as usize;
        }
        // Zipf-like: squaring a uniform draw favors the first (most common) words.
        let u = rng.unit();
        let word = if rng.chance(0.015) {
            rng.below(2100).to_string()
        } else {
            words[((u * u) * words.len() as f64) as usize % words.len()].to_string()
        };
        if !out.is_empty() {
            out.push(' ');
        }
        let starts = out.is_empty() || out.ends_with(". ") || out.ends_with("? ") || out.ends_with("! ");
        if starts {
            let mut cs = word.chars();
            if let Some(c) = cs.next() {
                out.extend(c.to_uppercase());
                out.push_str(cs.as_str());
            }
        } else {
            out.push_str(&word);
        }
        left_in_sentence -= 1;
        if left_in_sentence == 0 || k + 1 == n {
            let r = rng.unit();
            out.push(if r < 0.8 {
                '.'
            } else if r < 0.9 {
                '?'
            } else {
                '!'
            });
            left_in_sentence = 0;
        } else if rng.chance(0.07) {
            out.push(if rng.chance(0.85) { ',' } else { ';' });
        }
    }
    out
}

/// Trains the BERT-style WordPiece tokenizer on `lines`.
///
/// The `tokenizers` trainer numbers the `##x` continuation characters in hash-map order, which
/// changes from run to run and, through tie-breaking between equally frequent merges, changes
/// the learned vocabulary. To make training reproducible they are declared up front (sorted)
/// as extra initial tokens; the final tokenizer then keeps the trained vocabulary with only the
/// five real special tokens.
fn train_tokenizer(lines: &[String]) -> anyhow::Result<Tokenizer> {
    let mut chars: Vec<char> = lines
        .iter()
        .flat_map(|l| l.chars())
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect();
    chars.sort_unstable();
    chars.dedup();
    let mut initial: Vec<AddedToken> = SPECIALS.iter().map(|s| AddedToken::from(*s, true)).collect();
    initial.extend(chars.iter().map(|c| AddedToken::from(format!("##{c}"), true)));

    let normalizer = BertNormalizer::new(true, true, None, true);
    let mut trainer = WordPieceTrainer::builder()
        .vocab_size(VOCAB)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(initial)
        .continuing_subword_prefix("##".to_string())
        .build();
    let mut training = TokenizerBuilder::<
        WordPiece,
        BertNormalizer,
        BertPreTokenizer,
        TemplateProcessing,
        tokenizers::decoders::wordpiece::WordPiece,
    >::new()
    .with_model(WordPiece::default())
    .with_normalizer(Some(normalizer))
    .with_pre_tokenizer(Some(BertPreTokenizer))
    .build()
    .map_err(|e| anyhow::anyhow!("building the tokenizer to train: {e}"))?;
    training
        .train(&mut trainer, lines.iter())
        .map_err(|e| anyhow::anyhow!("training the WordPiece tokenizer: {e}"))?;
    // `WordPiece::default()` is what BERT uses: `[UNK]`, `##`, 100 chars per word at most.
    let model = training.get_model().clone();
    let id = |t: &str| model.token_to_id(t).ok_or_else(|| anyhow::anyhow!("trained vocabulary lacks {t}"));
    let (cls, sep) = (id("[CLS]")?, id("[SEP]")?);
    let post = TemplateProcessing::builder()
        .try_single("[CLS] $A [SEP]")
        .and_then(|b| b.try_pair("[CLS] $A [SEP] $B:1 [SEP]:1"))
        .map_err(|e| anyhow::anyhow!("tokenizer template: {e}"))?
        .special_tokens(vec![("[CLS]", cls), ("[SEP]", sep)])
        .build()
        .map_err(|e| anyhow::anyhow!("tokenizer template: {e}"))?;
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(normalizer))
        .with_pre_tokenizer(Some(BertPreTokenizer))
        .with_post_processor(Some(post))
        .with_decoder(Some(tokenizers::decoders::wordpiece::WordPiece::default()));
    let specials: Vec<AddedToken> = SPECIALS.iter().map(|s| AddedToken::from(*s, true)).collect();
    tokenizer.add_special_tokens(&specials);
    Ok(tokenizer)
}

fn write_text(dir: &Path, opts: &DataOptions, summary: &mut DataSummary) -> anyhow::Result<()> {
    let text = dir.join("text");
    fresh_dir(&text, |n| numbered(n, "part-", ".jsonl"))?;
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut rng = stream(opts.seed, 2, 0);
    let lines: Vec<String> = (0..opts.text_lines).map(|_| make_line(&mut rng, &words)).collect();

    let per_part = opts.text_lines.div_ceil(TEXT_PARTS).max(1);
    for part in 0..TEXT_PARTS {
        let mut out = String::new();
        let start = (part * per_part).min(lines.len());
        let end = ((part + 1) * per_part).min(lines.len());
        for (i, line) in lines.iter().enumerate().take(end).skip(start) {
            let record = serde_json::json!({ "id": i, "text": line });
            out.push_str(&serde_json::to_string(&record)?);
            out.push('\n');
        }
        summary.text_bytes += write(&text.join(format!("part-{part:04}.jsonl")), out.as_bytes())?;
        summary.text_files += 1;
    }
    summary.text_lines = lines.len();
    summary.total_bytes += summary.text_bytes;

    let tokenizer = train_tokenizer(&lines)?;
    summary.vocab_size = tokenizer.get_vocab_size(true);
    let json = tokenizer.to_string(false).map_err(|e| anyhow::anyhow!("serializing the tokenizer: {e}"))?;
    summary.total_bytes += write(&text.join("tokenizer.json"), json.as_bytes())?;
    Ok(())
}

// ----------------------------------------------------------------------------------- table --

fn write_table(dir: &Path, opts: &DataOptions, summary: &mut DataSummary) -> anyhow::Result<()> {
    let tables = dir.join("tables");
    fs::create_dir_all(&tables).with_context(|| format!("cannot create {}", tables.display()))?;
    let n = opts.table_rows;
    let mut rng = stream(opts.seed, 3, 0);
    // Per-class feature centers, so that the features carry signal about the label.
    let centers: Vec<f64> = (0..TABLE_CLASSES * 8).map(|_| rng.normal()).collect();
    let mut labels = Vec::with_capacity(n);
    let mut features: Vec<Vec<f64>> = (0..8).map(|_| Vec::with_capacity(n)).collect();
    let mut categories = Vec::with_capacity(n);
    for _ in 0..n {
        let label = rng.below(TABLE_CLASSES);
        labels.push(label as i32);
        for (f, column) in features.iter_mut().enumerate() {
            column.push(centers[(label * 8) as usize + f] + rng.normal() * (0.5 + 0.25 * f as f64));
        }
        categories.push(CATEGORIES[rng.below(CATEGORIES.len() as u64) as usize]);
    }

    let mut fields =
        vec![Field::new("id", DataType::Int64, false), Field::new("label", DataType::Int32, false)];
    fields.extend((0..8).map(|f| Field::new(format!("f{f}"), DataType::Float64, false)));
    fields.push(Field::new("category", DataType::Utf8, false));
    let schema = Arc::new(Schema::new(fields));
    let mut columns: Vec<ArrayRef> =
        vec![Arc::new(Int64Array::from_iter_values(0..n as i64)), Arc::new(Int32Array::from(labels))];
    columns.extend(features.into_iter().map(|c| Arc::new(Float64Array::from(c)) as ArrayRef));
    columns.push(Arc::new(StringArray::from(categories)));
    let batch = RecordBatch::try_new(schema.clone(), columns).context("building the table")?;

    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP))
        .build();
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, schema, Some(props)).context("writing Parquet")?;
    writer.write(&batch).context("writing Parquet")?;
    let meta = writer.close().context("writing Parquet")?;
    summary.row_groups = meta.num_row_groups();
    summary.table_rows = n;
    summary.table_bytes = write(&tables.join("features.parquet"), &bytes)?;
    summary.total_bytes += summary.table_bytes;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    /// Every file under `dir`, by relative path.
    fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            for e in fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(root, &p, out);
                } else {
                    out.insert(p.strip_prefix(root).unwrap().to_path_buf(), fs::read(&p).unwrap());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(dir, dir, &mut out);
        out
    }

    fn small() -> DataOptions {
        DataOptions { images: 70, text_lines: 300, table_rows: 2500, seed: 11, image_scale: 1 }
    }

    #[test]
    fn same_seed_same_bytes_and_counts_right() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let sa = generate(a.path(), &small()).unwrap();
        let sb = generate(b.path(), &small()).unwrap();
        assert_eq!(sa, sb);
        let (fa, fb) = (files(a.path()), files(b.path()));
        assert_eq!(fa.keys().collect::<Vec<_>>(), fb.keys().collect::<Vec<_>>());
        for (k, v) in &fa {
            assert!(fb[k] == *v, "{} differs between runs", k.display());
        }
        assert_eq!(sa.images, 70);
        assert_eq!(sa.shards, 2);
        assert_eq!(sa.text_lines, 300);
        assert_eq!(sa.text_files, 4);
        assert_eq!(sa.table_rows, 2500);
        assert_eq!(sa.row_groups, 3);
        assert_eq!(sa.total_bytes, fa.values().map(|v| v.len() as u64).sum::<u64>());
        assert_eq!(fa.keys().filter(|k| k.starts_with("images/train")).count(), 70);
        assert!(fa.contains_key(Path::new("images/train/00000069.jpg")));
        assert!(fa.contains_key(Path::new("images-wds/shard-000001.tar")));

        let other = tempfile::tempdir().unwrap();
        generate(other.path(), &DataOptions { seed: 12, ..small() }).unwrap();
        assert_ne!(
            files(other.path())[Path::new("images/train/00000000.jpg")],
            fa[Path::new("images/train/00000000.jpg")]
        );
    }

    #[test]
    fn files_are_what_the_sources_expect() {
        let dir = tempfile::tempdir().unwrap();
        let opts = small();
        generate(dir.path(), &opts).unwrap();
        let root = dir.path();

        // JPEGs decode, have the promised sides, and are neither constant nor noise-sized.
        for i in [0usize, 33, 69] {
            let bytes = fs::read(root.join(format!("images/train/{i:08}.jpg"))).unwrap();
            let img = image::load_from_memory(&bytes).unwrap().to_rgb8();
            assert!((160..=400).contains(&img.width()) && (160..=400).contains(&img.height()));
            let (lo, hi) = img.as_raw().iter().fold((255u8, 0u8), |(l, h), &v| (l.min(v), h.max(v)));
            assert!(hi - lo > 100, "image {i} has contrast");
            let bpp = bytes.len() as f64 / f64::from(img.width() * img.height());
            assert!(bpp < 2.0, "image {i}: {bpp} bytes per pixel looks like noise");
        }

        // labels.jsonl: one record per image, fields as gen_data.py writes them.
        let labels = fs::read_to_string(root.join("images/labels.jsonl")).unwrap();
        let records: Vec<serde_json::Value> =
            labels.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(records.len(), opts.images);
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r["idx"], i);
            assert_eq!(r["file"], format!("train/{i:08}.jpg"));
            assert!(r["label"].as_u64().unwrap() < 1000);
        }
        assert!(labels.starts_with("{\"idx\": 0, \"file\": \"train/00000000.jpg\", \"label\": "));

        // WebDataset shards: jpg + cls per sample, in order, same bytes and labels.
        let mut seen = 0;
        for k in 0..2 {
            let f = fs::File::open(root.join(format!("images-wds/shard-{k:06}.tar"))).unwrap();
            let mut ar = tar::Archive::new(f);
            let mut names = Vec::new();
            for e in ar.entries().unwrap() {
                let mut e = e.unwrap();
                let name = e.path().unwrap().to_string_lossy().into_owned();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                let i: usize = name[..8].parse().unwrap();
                if name.ends_with(".jpg") {
                    assert_eq!(data, fs::read(root.join(format!("images/train/{name}"))).unwrap());
                } else {
                    assert_eq!(String::from_utf8(data).unwrap(), records[i]["label"].to_string());
                    seen += 1;
                }
                names.push(name);
            }
            let first = k * SHARD_SAMPLES;
            assert_eq!(names[0], format!("{first:08}.jpg"));
            assert_eq!(names[1], format!("{first:08}.cls"));
        }
        assert_eq!(seen, opts.images);

        // Text: ids 0..n over four files; the tokenizer loads and encodes with [CLS] .. [SEP].
        let mut ids = Vec::new();
        for p in 0..TEXT_PARTS {
            let part = fs::read_to_string(root.join(format!("text/part-{p:04}.jsonl"))).unwrap();
            for l in part.lines() {
                let r: serde_json::Value = serde_json::from_str(l).unwrap();
                let words = r["text"].as_str().unwrap().split_whitespace().count();
                assert!((5..=120).contains(&words), "{words} words");
                ids.push(r["id"].as_u64().unwrap());
            }
        }
        assert_eq!(ids, (0..opts.text_lines as u64).collect::<Vec<_>>());
        let tok = Tokenizer::from_file(root.join("text/tokenizer.json")).unwrap();
        assert_eq!(tok.token_to_id("[PAD]"), Some(0));
        let enc = tok.encode("The river, the mountain.", true).unwrap();
        assert_eq!(enc.get_ids()[0], tok.token_to_id("[CLS]").unwrap());
        assert_eq!(*enc.get_ids().last().unwrap(), tok.token_to_id("[SEP]").unwrap());
        assert!(!enc.get_ids().contains(&tok.token_to_id("[UNK]").unwrap()));
        assert!(tok.get_vocab_size(true) > 300);

        // Parquet: row count, row groups, column types.
        let f = fs::File::open(root.join("tables/features.parquet")).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 3);
        assert_eq!(reader.metadata().file_metadata().num_rows(), 2500);
        let schema = reader.schema().clone();
        let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "label", "f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "category"]);
        assert_eq!(schema.field(1).data_type(), &DataType::Int32);
        assert_eq!(schema.field(10).data_type(), &DataType::Utf8);
    }

    #[test]
    fn a_smaller_run_removes_stale_files() {
        let dir = tempfile::tempdir().unwrap();
        generate(
            dir.path(),
            &DataOptions { images: 130, text_lines: 20, table_rows: 10, seed: 1, image_scale: 1 },
        )
        .unwrap();
        generate(
            dir.path(),
            &DataOptions { images: 3, text_lines: 20, table_rows: 10, seed: 1, image_scale: 1 },
        )
        .unwrap();
        assert_eq!(fs::read_dir(dir.path().join("images/train")).unwrap().count(), 3);
        assert_eq!(fs::read_dir(dir.path().join("images-wds")).unwrap().count(), 1);
    }
}

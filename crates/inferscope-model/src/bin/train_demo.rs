//! Trains the shipped demo model (`models/demo`): a byte-level BPE tokenizer
//! and a tiny Llama on *Pride and Prejudice*, on the CPU with candle's autograd.
//!
//! ```text
//! cargo run --release -p inferscope-model --features train --bin train-demo -- --out models/demo
//! ```
//!
//! The last chapter of the book is held out for validation. Seeded: the same
//! command on the same machine gives the same weights (rayon's reductions may
//! differ in the last bits across core counts).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::{AdamW, Embedding, Linear, Module, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use inferscope_model::demo::SplitMix64;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer, TokenizerImpl};

/// The first words of the held-out last chapter (LXI).
const HELD_OUT_START: &str = "Happy for all her maternal feelings was the day";

/// Hyper-parameters and paths, from `--key value` arguments.
struct Args {
    out: PathBuf,
    vocab: usize,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
    seq: usize,
    batch: usize,
    steps: usize,
    lr: f64,
    seed: u64,
}

impl Args {
    fn parse() -> Result<Self, String> {
        let mut a = Args {
            out: PathBuf::from("models/demo"),
            vocab: 4096,
            hidden: 256,
            layers: 4,
            heads: 8,
            kv_heads: 4,
            ffn: 688,
            seq: 128,
            batch: 16,
            steps: 1200,
            lr: 3e-3,
            seed: 17,
        };
        let argv: Vec<String> = std::env::args().skip(1).collect();
        for pair in argv.chunks(2) {
            let [k, v] = pair else {
                return Err(format!("{} needs a value", pair[0]));
            };
            let num = || {
                v.parse::<usize>()
                    .map_err(|_| format!("{k}: {v:?} is not a whole number"))
            };
            match k.as_str() {
                "--out" => a.out = PathBuf::from(v),
                "--vocab" => a.vocab = num()?,
                "--hidden" => a.hidden = num()?,
                "--layers" => a.layers = num()?,
                "--heads" => a.heads = num()?,
                "--kv-heads" => a.kv_heads = num()?,
                "--ffn" => a.ffn = num()?,
                "--seq" => a.seq = num()?,
                "--batch" => a.batch = num()?,
                "--steps" => a.steps = num()?,
                "--seed" => a.seed = num()? as u64,
                "--lr" => {
                    a.lr = v
                        .parse()
                        .map_err(|_| format!("--lr: {v:?} is not a number"))?
                }
                other => return Err(format!("unknown option {other}")),
            }
        }
        Ok(a)
    }

    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() {
    if let Err(e) = run() {
        eprintln!("train-demo: {e}");
        std::process::exit(1);
    }
}

fn run() -> Res<()> {
    let args = Args::parse()?;
    let started = Instant::now();
    let book = read_book(&args.out.join("pride-and-prejudice.txt.gz"))?;
    let split = book
        .find(HELD_OUT_START)
        .ok_or("the book lacks the opening of its last chapter")?;
    let (train_text, val_text) = book.split_at(split);
    println!(
        "book: {} bytes; training on {} bytes, holding out the last chapter ({} bytes)",
        book.len(),
        train_text.len(),
        val_text.len()
    );

    let tokenizer = train_tokenizer(train_text, args.vocab)?;
    let tok_path = args.out.join("tokenizer.json");
    tokenizer.save(&tok_path, false)?;
    let bos = tokenizer.token_to_id("<s>").ok_or("no <s>")?;
    let eos = tokenizer.token_to_id("</s>").ok_or("no </s>")?;
    let enc = |t: &str| -> Res<Vec<u32>> { Ok(tokenizer.encode(t, false)?.get_ids().to_vec()) };
    let train_ids = enc(train_text)?;
    let val_ids = enc(val_text)?;
    println!(
        "tokenizer: {} tokens -> {}; train {} tokens, validation {} tokens ({:.2} bytes/token)",
        tokenizer.get_vocab_size(true),
        tok_path.display(),
        train_ids.len(),
        val_ids.len(),
        train_text.len() as f64 / train_ids.len() as f64
    );
    let unigram = unigram_baseline(&train_ids, &val_ids, args.vocab);
    println!(
        "unigram baseline (train counts, add-one): validation loss {unigram:.4} nats/token, perplexity {:.1}",
        unigram.exp()
    );

    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let model = Llama::new(&args, vb)?;
    seed_weights(&varmap, args.layers, args.seed)?;
    let n_params: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    println!(
        "model: {} parameters ({:.1} MB as bf16), {} layers, hidden {}, {} heads / {} kv heads, ffn {}",
        n_params,
        n_params as f64 * 2.0 / 1e6,
        args.layers,
        args.hidden,
        args.heads,
        args.kv_heads,
        args.ffn
    );
    let mut opt = AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr: args.lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        },
    )?;
    let mut rng = SplitMix64::new(args.seed ^ 0x5eed);
    let warmup = (args.steps / 20).max(1);
    let mut smoothed = f64::NAN;
    let t0 = Instant::now();
    for step in 1..=args.steps {
        let lr = schedule(args.lr, step, warmup, args.steps);
        opt.set_learning_rate(lr);
        let (x, y) = batch(&train_ids, bos, args.seq, args.batch, &mut rng, &dev)?;
        let logits = model.forward(&x)?;
        let loss = candle_nn::loss::cross_entropy(&logits.flatten_to(1)?, &y.flatten_all()?)?;
        opt.backward_step(&loss)?;
        let l = f64::from(loss.to_scalar::<f32>()?);
        smoothed = if smoothed.is_nan() {
            l
        } else {
            0.95 * smoothed + 0.05 * l
        };
        if step % 10 == 0 || step == 1 || step == args.steps {
            let per_step = t0.elapsed().as_secs_f64() / step as f64;
            let eta = per_step * (args.steps - step) as f64;
            println!(
                "{} step {step:>5}/{} loss {l:.4} (avg {smoothed:.4}) lr {lr:.2e} {per_step:.2} s/step eta {:.0}m{:02.0}s",
                bar(step, args.steps),
                args.steps,
                (eta / 60.0).floor(),
                eta % 60.0
            );
            std::io::stdout().flush().ok();
        }
        if step % 100 == 0 && step != args.steps {
            save(&args, &varmap, bos, eos)?;
        }
    }
    let train_loss = evaluate(
        &model,
        &train_ids[..train_ids.len().min(val_ids.len() * 4)],
        bos,
        args.seq,
        &dev,
    )?;
    let val_loss = evaluate(&model, &val_ids, bos, args.seq, &dev)?;
    save(&args, &varmap, bos, eos)?;
    println!(
        "final: train loss {train_loss:.4} (ppl {:.1}), validation loss {val_loss:.4} (ppl {:.1}); unigram baseline {unigram:.4} (ppl {:.1})",
        train_loss.exp(),
        val_loss.exp(),
        unigram.exp()
    );
    println!(
        "wall time {:.1} min (training {:.1} min)",
        started.elapsed().as_secs_f64() / 60.0,
        t0.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

fn read_book(path: &Path) -> Res<String> {
    // The .gz is plain gzip; `gzip -dc` keeps a compression crate out of the build.
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(path)
        .output()
        .map_err(|e| format!("gzip -dc {}: {e}", path.display()))?;
    if !out.status.success() {
        return Err(format!("gzip -dc {} failed", path.display()).into());
    }
    let mut s = String::new();
    out.stdout.as_slice().read_to_string(&mut s)?;
    Ok(s)
}

/// A byte-level BPE over the training text; `<s>` is prepended on encode
/// with special tokens.
fn train_tokenizer(text: &str, vocab: usize) -> Res<Tokenizer> {
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![
            AddedToken::from("<s>", true),
            AddedToken::from("</s>", true),
        ])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tk: TokenizerImpl<
        BPE,
        tokenizers::NormalizerWrapper,
        ByteLevel,
        TemplateProcessing,
        ByteLevel,
    > = TokenizerImpl::new(BPE::default());
    tk.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tk.with_decoder(Some(ByteLevel::default()));
    let paragraphs: Vec<&str> = text.split_inclusive("\n\n").collect();
    tk.train(&mut trainer, paragraphs.into_iter())?;
    let bos = tk.token_to_id("<s>").ok_or("trainer lost <s>")?;
    tk.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("<s> $A")?
            .try_pair("<s> $A $B")?
            .special_tokens(vec![("<s>", bos)])
            .build()?,
    ));
    let json = serde_json::to_string(&tk)?;
    Ok(json.parse::<Tokenizer>()?)
}

/// Cross-entropy of the validation tokens under train-set unigram frequencies.
fn unigram_baseline(train: &[u32], val: &[u32], vocab: usize) -> f64 {
    let mut counts = vec![1.0f64; vocab];
    for &t in train {
        counts[t as usize] += 1.0;
    }
    let total: f64 = counts.iter().sum();
    let nll: f64 = val
        .iter()
        .map(|&t| -(counts[t as usize] / total).ln())
        .sum();
    nll / val.len() as f64
}

fn schedule(peak: f64, step: usize, warmup: usize, total: usize) -> f64 {
    if step <= warmup {
        return peak * step as f64 / warmup as f64;
    }
    let p = (step - warmup) as f64 / (total - warmup).max(1) as f64;
    // Cosine down to a tenth of the peak.
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
}

fn bar(step: usize, total: usize) -> String {
    let w = 24;
    let filled = step * w / total;
    format!("[{}{}]", "#".repeat(filled), "-".repeat(w - filled))
}

/// Random windows: `<s>` then `seq - 1` tokens, each predicting the next.
fn batch(
    ids: &[u32],
    bos: u32,
    seq: usize,
    n: usize,
    rng: &mut SplitMix64,
    dev: &Device,
) -> Res<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(n * seq);
    let mut y = Vec::with_capacity(n * seq);
    for _ in 0..n {
        let start = (rng.next_u64() % (ids.len() - seq) as u64) as usize;
        let w = &ids[start..start + seq];
        x.push(bos);
        x.extend_from_slice(&w[..seq - 1]);
        y.extend_from_slice(w);
    }
    Ok((
        Tensor::from_vec(x, (n, seq), dev)?,
        Tensor::from_vec(y, (n, seq), dev)?,
    ))
}

/// Mean loss per token over consecutive windows (`<s>` + `seq - 1` tokens).
fn evaluate(model: &Llama, ids: &[u32], bos: u32, seq: usize, dev: &Device) -> Res<f64> {
    let (mut sum, mut n) = (0.0f64, 0usize);
    for w in ids.chunks(seq) {
        if w.len() < 2 {
            continue;
        }
        let mut x = vec![bos];
        x.extend_from_slice(&w[..w.len() - 1]);
        let xt = Tensor::from_vec(x, (1, w.len()), dev)?;
        let yt = Tensor::from_vec(w.to_vec(), w.len(), dev)?;
        let logits = model.forward(&xt)?.squeeze(0)?;
        let l = candle_nn::loss::cross_entropy(&logits, &yt)?.to_scalar::<f32>()?;
        sum += f64::from(l) * w.len() as f64;
        n += w.len();
    }
    Ok(sum / n as f64)
}

/// Writes `config.json`, `generation_config.json`, `tokenizer_config.json`
/// and the weights as bf16 `model.safetensors`.
fn save(args: &Args, varmap: &VarMap, bos: u32, eos: u32) -> Res<()> {
    let data = varmap.data().lock().map_err(|_| "poisoned varmap")?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (name, var) in data.iter() {
        tensors.insert(name.clone(), var.as_tensor().to_dtype(DType::BF16)?);
    }
    drop(data);
    let tmp = args.out.join("model.safetensors.tmp");
    candle_core::safetensors::save(&tensors, &tmp)?;
    std::fs::rename(&tmp, args.out.join("model.safetensors"))?;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.ffn,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim(),
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    });
    std::fs::write(
        args.out.join("config.json"),
        serde_json::to_string_pretty(&config)? + "\n",
    )?;
    let generation = serde_json::json!({"bos_token_id": bos, "eos_token_id": eos});
    std::fs::write(
        args.out.join("generation_config.json"),
        serde_json::to_string_pretty(&generation)? + "\n",
    )?;
    // The model only knows the book: a chat turn becomes a paragraph of it,
    // and the reply is the paragraph that follows. BOS first, as in training
    // (a rendered chat is encoded without special tokens on top).
    let template =
        "{{ bos_token }}{% for m in messages %}{{ m['content'] | trim }}\n\n{% endfor %}";
    let tok_config = serde_json::json!({
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_bos_token": true,
        "chat_template": template,
    });
    std::fs::write(
        args.out.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&tok_config)? + "\n",
    )?;
    Ok(())
}

/// The same Llama as `inferscope_model::llama`, written with differentiable
/// candle ops (RMSNorm, rotate-half RoPE, GQA, SwiGLU, tied LM head).
struct Llama {
    embed: Embedding,
    layers: Vec<Block>,
    norm: Tensor,
    cos: Tensor,
    sin: Tensor,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

struct Block {
    attn_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    mlp_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// Overwrites the initial weights from `seed` (candle's CPU `randn` cannot be
/// seeded): uniform with std 0.02, residual projections scaled down with
/// depth (GPT-2 style), norms at one.
fn seed_weights(varmap: &VarMap, layers: usize, seed: u64) -> Res<()> {
    let data = varmap.data().lock().map_err(|_| "poisoned varmap")?;
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    let mut rng = SplitMix64::new(seed);
    for name in names {
        if name.contains("norm") {
            continue;
        }
        let std = if name.contains("o_proj") || name.contains("down_proj") {
            0.02 / (2.0 * layers as f32).sqrt()
        } else {
            0.02
        };
        let var = &data[name];
        let a = std * 3f32.sqrt();
        let v: Vec<f32> = (0..var.elem_count())
            .map(|_| (rng.next_f32() * 2.0 - 1.0) * a)
            .collect();
        var.set(&Tensor::from_vec(v, var.shape(), var.device())?)?;
    }
    Ok(())
}

fn linear(vb: VarBuilder, inp: usize, out: usize, std: f64) -> Res<Linear> {
    let w = vb.get_with_hints(
        (out, inp),
        "weight",
        candle_nn::Init::Randn {
            mean: 0.0,
            stdev: std,
        },
    )?;
    Ok(Linear::new(w, None))
}

impl Llama {
    fn new(a: &Args, vb: VarBuilder) -> Res<Self> {
        let std = 0.02;
        // Residual projections scaled down with depth (GPT-2 style).
        let res_std = std / (2.0 * a.layers as f64).sqrt();
        let m = vb.pp("model");
        let emb = m.pp("embed_tokens").get_with_hints(
            (a.vocab, a.hidden),
            "weight",
            candle_nn::Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        )?;
        let embed = Embedding::new(emb, a.hidden);
        let hd = a.head_dim();
        let (q_dim, kv_dim) = (a.heads * hd, a.kv_heads * hd);
        let mut layers = Vec::new();
        for l in 0..a.layers {
            let p = m.pp("layers").pp(l);
            layers.push(Block {
                attn_norm: norm_var(&p.pp("input_layernorm"), a.hidden)?,
                q: linear(p.pp("self_attn").pp("q_proj"), a.hidden, q_dim, std)?,
                k: linear(p.pp("self_attn").pp("k_proj"), a.hidden, kv_dim, std)?,
                v: linear(p.pp("self_attn").pp("v_proj"), a.hidden, kv_dim, std)?,
                o: linear(p.pp("self_attn").pp("o_proj"), q_dim, a.hidden, res_std)?,
                mlp_norm: norm_var(&p.pp("post_attention_layernorm"), a.hidden)?,
                gate: linear(p.pp("mlp").pp("gate_proj"), a.hidden, a.ffn, std)?,
                up: linear(p.pp("mlp").pp("up_proj"), a.hidden, a.ffn, std)?,
                down: linear(p.pp("mlp").pp("down_proj"), a.ffn, a.hidden, res_std)?,
            });
        }
        let norm = norm_var(&m.pp("norm"), a.hidden)?;
        // HF rotate-half RoPE tables, [seq, head_dim].
        let dev = vb.device();
        let inv: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
            .collect();
        let mut ang = Vec::with_capacity(a.seq * hd / 2);
        for p in 0..a.seq {
            ang.extend(inv.iter().map(|f| p as f32 * f));
        }
        let ang = Tensor::from_vec(ang, (a.seq, hd / 2), dev)?;
        let ang = Tensor::cat(&[&ang, &ang], 1)?;
        Ok(Self {
            embed,
            layers,
            norm,
            cos: ang.cos()?,
            sin: ang.sin()?,
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: hd,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = x.dims2()?;
        let mut h = self.embed.forward(x)?;
        let mask: Vec<f32> = (0..t)
            .flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), x.device())?;
        let cos = self.cos.narrow(0, 0, t)?;
        let sin = self.sin.narrow(0, 0, t)?;
        let hd = self.head_dim;
        let rep = self.heads / self.kv_heads;
        for l in &self.layers {
            let a = rms_norm(&h, &l.attn_norm)?;
            let heads = |lin: &Linear, n: usize| -> candle_core::Result<Tensor> {
                lin.forward(&a)?
                    .reshape((b, t, n, hd))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = rope(&heads(&l.q, self.heads)?, &cos, &sin)?;
            let k = rope(&heads(&l.k, self.kv_heads)?, &cos, &sin)?;
            let v = heads(&l.v, self.kv_heads)?;
            let (k, v) = (repeat_kv(&k, rep)?, repeat_kv(&v, rep)?);
            let scores = (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?;
            let p = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
            let o = p
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((b, t, self.heads * hd))?;
            h = (h + l.o.forward(&o)?)?;
            let m = rms_norm(&h, &l.mlp_norm)?;
            let g = l.gate.forward(&m)?;
            let silu = (&g * (g.neg()?.exp()? + 1.0)?.recip()?)?;
            h = (h + l.down.forward(&(silu * l.up.forward(&m)?)?)?)?;
        }
        let h = rms_norm(&h, &self.norm)?;
        h.broadcast_matmul(&self.embed.embeddings().t()?)
    }
}

fn norm_var(vb: &VarBuilder, n: usize) -> Res<Tensor> {
    Ok(vb.get_with_hints(n, "weight", candle_nn::Init::Const(1.0))?)
}

fn rms_norm(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + 1e-5)?.sqrt()?)?.broadcast_mul(w)
}

fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let hd = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, hd / 2)?;
    let x2 = x.narrow(D::Minus1, hd / 2, hd / 2)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rot.broadcast_mul(sin)?
}

fn repeat_kv(x: &Tensor, rep: usize) -> candle_core::Result<Tensor> {
    if rep == 1 {
        return Ok(x.clone());
    }
    let (b, kv, t, hd) = x.dims4()?;
    Tensor::cat(&vec![x; rep], 2)?.reshape((b, kv * rep, t, hd))
}

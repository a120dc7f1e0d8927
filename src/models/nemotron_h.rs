//! nemotron_h (Nemotron-H, Nemotron-Nano-9B-v2, Nemotron-3 Nano/Super). Follows mlx-lm
//! `models/nemotron_h.py`, with `ssm.py`'s `ssm_attn` (the path mlx-lm takes off the GPU, for the
//! prompt and for every decode step), `cache.py`'s `ArraysCache` and `switch_layers.py`'s
//! `SwitchMLP`.
//!
//! A hybrid pre-norm stack (`x + mixer(norm(x))`) whose `hybrid_override_pattern` (or
//! `layers_block_type` / `layer_types`) gives each layer's kind:
//! - `M`: a Mamba2 mixer. `in_proj` → gate | conv input | dt; a depthwise causal conv1d (its last
//!   `conv_kernel - 1` inputs carried in the cache, slot 0) then silu; the conv output splits into
//!   x | B | C (B and C shared by the `mamba_num_heads / n_groups` heads of a group); the SSD scan
//!   in chunks of 256 with `dt = clip(softplus(dt + dt_bias), time_step_limit)` and
//!   `A = -exp(A_log)` in float32, the state (slot 1) in float32; the `D` skip; an RMSNorm per
//!   group of `silu(gate) · y`; `out_proj`.
//! - `*`: attention without rope (causal through the KV cache).
//! - `-`: `down(relu²(up(x)))`.
//! - `E`: a mixture of relu² experts routed as deepseek_v3's `noaux_tc` (sigmoid scores, the
//!   `e_score_correction_bias` for the choice only, optional expert groups, normalised top-k,
//!   `routed_scaling_factor`), an optional latent projection around the experts, an optional
//!   shared expert applied to the layer input.
//!
//! MLP and MoE layers keep no state; each still has a cache slot (an empty [`StateCache`] that
//! only counts tokens), so every layer has one.
use super::deepseek::group_expert_select;
use super::{run_layers, ArchConfig, Architecture, CausalLm, LmHead, Loadable};
use crate::error::{Error, Result};
use crate::loader::{check_size, ModelConfig, Vb};
use crate::mlx::{fast, Array, Dtype};
use crate::nn::moe::stack_experts;
use crate::nn::switch::combine;
use crate::nn::{Attention, AttentionSpec, Cache, Embedding, KvCache, LayerCaches, Linear, Params, RmsNorm, StateCache, SwitchLinear};
use serde::Deserialize;
use serde_json::Value;

// ---- config -------------------------------------------------------------------------------

/// mlx-lm's `ModelArgs` of nemotron_h (the fields it requires are required here).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub attention_bias: bool,
    pub mamba_num_heads: usize,
    pub mamba_head_dim: usize,
    pub mamba_proj_bias: bool,
    pub ssm_state_size: usize,
    pub conv_kernel: usize,
    pub n_groups: usize,
    pub mlp_bias: bool,
    pub layer_norm_epsilon: f32,
    pub use_conv_bias: bool,
    /// A string of `M`, `*`, `-`, `E` (or a list of such characters).
    #[serde(default)]
    pub hybrid_override_pattern: Option<Value>,
    #[serde(default)]
    pub layers_block_type: Option<Vec<String>>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    #[serde(default)]
    pub moe_shared_expert_intermediate_size: Option<usize>,
    #[serde(default)]
    pub moe_latent_size: Option<usize>,
    #[serde(default)]
    pub n_group: Option<usize>,
    #[serde(default)]
    pub n_routed_experts: Option<usize>,
    #[serde(default)]
    pub n_shared_experts: Option<usize>,
    #[serde(default)]
    pub topk_group: Option<usize>,
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    #[serde(default)]
    pub routed_scaling_factor: Option<f32>,
    /// `[min, max]` of the time step (default `(0, inf)`).
    #[serde(default)]
    pub time_step_limit: Option<Vec<f32>>,
}

/// One layer's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Mamba,
    Attention,
    Mlp,
    Moe,
}

impl BlockKind {
    fn from_char(c: char) -> Option<Self> {
        match c {
            'M' => Some(BlockKind::Mamba),
            '*' => Some(BlockKind::Attention),
            '-' => Some(BlockKind::Mlp),
            'E' => Some(BlockKind::Moe),
            _ => None,
        }
    }

    /// mlx-lm's `_block_type_to_char`.
    fn from_name(s: &str) -> Option<Self> {
        match s {
            "full_attention" | "attention" => Some(BlockKind::Attention),
            "linear_attention" | "mamba" | "conv" => Some(BlockKind::Mamba),
            "moe" => Some(BlockKind::Moe),
            "mlp" => Some(BlockKind::Mlp),
            _ => None,
        }
    }
}

/// The MoE fields, required once the pattern has an `E` layer.
#[derive(Debug, Clone, Copy)]
struct MoeFields {
    experts: usize,
    k: usize,
    inter: usize,
    n_group: usize,
    topk_group: usize,
    scale: f32,
}

impl Config {
    /// Each layer's kind, from the pattern (mlx-lm prefers `hybrid_override_pattern`).
    pub fn kinds(&self) -> std::result::Result<Vec<BlockKind>, String> {
        let bad = |i: usize, s: &str| format!("field 'hybrid_override_pattern[{i}]' = '{s}' is not one of M, *, -, E");
        let kinds: Vec<BlockKind> = match &self.hybrid_override_pattern {
            Some(Value::String(s)) => s
                .chars()
                .enumerate()
                .map(|(i, c)| BlockKind::from_char(c).ok_or_else(|| bad(i, &c.to_string())))
                .collect::<std::result::Result<_, _>>()?,
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let s = v.as_str().unwrap_or("");
                    let mut cs = s.chars();
                    match (cs.next(), cs.next()) {
                        (Some(c), None) => BlockKind::from_char(c).ok_or_else(|| bad(i, s)),
                        _ => Err(bad(i, s)),
                    }
                })
                .collect::<std::result::Result<_, _>>()?,
            Some(_) => return Err("field 'hybrid_override_pattern' must be a string or a list".into()),
            None => {
                let (field, list) = match (&self.layers_block_type, &self.layer_types) {
                    (Some(l), _) => ("layers_block_type", l),
                    (None, Some(l)) => ("layer_types", l),
                    (None, None) => {
                        return Err("field 'hybrid_override_pattern' (or 'layers_block_type') is missing: \
                                    it describes the layer stack"
                            .into())
                    }
                };
                list.iter()
                    .enumerate()
                    .map(|(i, s)| {
                        BlockKind::from_name(s).ok_or_else(|| format!("field '{field}[{i}]' = '{s}' is not a known block type"))
                    })
                    .collect::<std::result::Result<_, _>>()?
            }
        };
        if kinds.is_empty() {
            return Err("field 'hybrid_override_pattern' is empty".into());
        }
        Ok(kinds)
    }

    fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    fn inner(&self) -> usize {
        self.mamba_num_heads * self.mamba_head_dim
    }

    fn conv_dim(&self) -> usize {
        self.inner() + 2 * self.n_groups * self.ssm_state_size
    }

    fn time_step_limit(&self) -> std::result::Result<(f32, f32), String> {
        match &self.time_step_limit {
            None => Ok((0.0, f32::INFINITY)),
            Some(v) if v.len() == 2 && v[0] <= v[1] => Ok((v[0], v[1])),
            Some(v) => Err(format!("field 'time_step_limit' = {v:?} must be [min, max]")),
        }
    }

    fn moe(&self) -> std::result::Result<MoeFields, String> {
        let need = |name: &str, v: Option<usize>| -> std::result::Result<usize, String> {
            let v = v.ok_or_else(|| format!("field '{name}' is required by MoE ('E') layers"))?;
            check_size(name, v)?;
            Ok(v)
        };
        let experts = need("n_routed_experts", self.n_routed_experts)?;
        let k = need("num_experts_per_tok", self.num_experts_per_tok)?;
        let inter = need("moe_intermediate_size", self.moe_intermediate_size)?;
        let n_group = need("n_group", self.n_group)?;
        let topk_group = if n_group > 1 { need("topk_group", self.topk_group)? } else { self.topk_group.unwrap_or(1) };
        let scale = self.routed_scaling_factor.ok_or("field 'routed_scaling_factor' is required by MoE ('E') layers")?;
        if k > experts {
            return Err(format!("field 'num_experts_per_tok' = {k} exceeds n_routed_experts = {experts}"));
        }
        if experts % n_group != 0 {
            return Err(format!("field 'n_group' = {n_group} must divide n_routed_experts = {experts}"));
        }
        if n_group > 1 {
            if topk_group > n_group {
                return Err(format!("field 'topk_group' = {topk_group} exceeds n_group = {n_group}"));
            }
            if experts / n_group < 2 {
                return Err(format!("field 'n_group' = {n_group} leaves fewer than 2 experts per group"));
            }
            if k > topk_group * (experts / n_group) {
                return Err(format!("field 'num_experts_per_tok' = {k} exceeds the experts of topk_group = {topk_group} groups"));
            }
        }
        if let Some(l) = self.moe_latent_size {
            check_size("moe_latent_size", l)?;
        }
        if self.n_shared_experts.is_some() {
            if let Some(s) = self.moe_shared_expert_intermediate_size {
                check_size("moe_shared_expert_intermediate_size", s)?;
            }
        }
        Ok(MoeFields { experts, k, inter, n_group, topk_group, scale })
    }
}

impl ArchConfig for Config {
    fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("mamba_num_heads", self.mamba_num_heads),
            ("mamba_head_dim", self.mamba_head_dim),
            ("ssm_state_size", self.ssm_state_size),
            ("conv_kernel", self.conv_kernel),
            ("n_groups", self.n_groups),
        ] {
            check_size(name, v)?;
        }
        if let Some(h) = self.head_dim {
            check_size("head_dim", h)?;
        } else if self.hidden_size % self.num_attention_heads != 0 {
            return Err(format!(
                "field 'hidden_size' = {} is not divisible by num_attention_heads = {} (and 'head_dim' is not set)",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "field 'num_attention_heads' = {} is not a multiple of num_key_value_heads = {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.mamba_num_heads % self.n_groups != 0 {
            return Err(format!(
                "field 'n_groups' = {} must divide mamba_num_heads = {}",
                self.n_groups, self.mamba_num_heads
            ));
        }
        if !(self.layer_norm_epsilon > 0.0 && self.layer_norm_epsilon < 1.0) {
            return Err(format!("field 'layer_norm_epsilon' = {} is out of range", self.layer_norm_epsilon));
        }
        self.time_step_limit()?;
        let kinds = self.kinds()?;
        if kinds.contains(&BlockKind::Moe) {
            self.moe()?;
        }
        Ok(())
    }
}

// ---- small ops ----------------------------------------------------------------------------

/// `mx.repeat(x, r, axis)`: each slice along `axis` repeated `r` times in place.
fn repeat(x: &Array, r: usize, axis: usize) -> Result<Array> {
    if r == 1 {
        return Ok(x.clone());
    }
    let mut shape = x.shape();
    let mut wide = shape.clone();
    wide.insert(axis + 1, r as i32);
    let y = x.expand_dims(axis as i32 + 1)?.broadcast_to(&wide)?;
    shape[axis] *= r as i32;
    y.reshape(&shape)
}

/// `mx.tril(x, k)` over the last two axes (`[…, n, n]`): entries with `j > i + k` zeroed.
fn tril(x: &Array, k: i32) -> Result<Array> {
    let n = x.dim(-1);
    let rows = Array::arange(0.0, n as f64, 1.0, Dtype::Int32)?.reshape(&[n, 1])?;
    let cols = Array::arange(0.0, n as f64, 1.0, Dtype::Int32)?.reshape(&[1, n])?;
    let keep = rows.add(&Array::scalar_i32(k, Dtype::Int32)?)?.greater_equal(&cols)?;
    Array::where_(&keep, x, &Array::scalar_f32(0.0, x.dtype())?)
}

/// `relu²`: `square(maximum(x, 0))`.
fn relu2(x: &Array) -> Result<Array> {
    x.maximum(&Array::scalar_f32(0.0, x.dtype())?)?.square()
}

// ---- Mamba2 mixer -------------------------------------------------------------------------

/// Chunk length of the SSD scan (mlx-lm's `ssm_attn(step=256)`).
const SSD_STEP: i32 = 256;

pub struct Mamba2Mixer {
    pub in_proj: Linear,
    /// `[conv_dim, conv_kernel, 1]` (MLX layout) and its bias.
    pub conv_weight: Array,
    pub conv_bias: Option<Array>,
    pub dt_bias: Array,
    pub a_log: Array,
    pub d: Array,
    pub norm_weight: Array,
    pub out_proj: Linear,
    heads: usize,
    head_dim: usize,
    groups: usize,
    state_size: usize,
    conv_kernel: usize,
    inner: usize,
    conv_dim: usize,
    eps: f32,
    dt_limit: (f32, f32),
}

impl Mamba2Mixer {
    /// Module `vb` (`backbone.layers.{i}.mixer`).
    fn load(vb: &Vb, c: &Config) -> Result<Self> {
        let (inner, conv_dim, heads) = (c.inner(), c.conv_dim(), c.mamba_num_heads);
        let conv = vb.pp("conv1d");
        // Hugging Face stores the depthwise kernel as [C, 1, K]; mlx-lm's sanitize moves it to [C, K, 1].
        conv.remake("weight", |w| {
            let w = if w.ndim() == 3 && w.dim(-1) != 1 { w.swapaxes(1, 2)? } else { w };
            Ok(vec![("weight".into(), w)])
        })?;
        Ok(Mamba2Mixer {
            in_proj: Linear::load(&vb.pp("in_proj"), c.hidden_size, inner + conv_dim + heads, c.mamba_proj_bias)?,
            conv_weight: conv.get("weight", &[conv_dim, c.conv_kernel, 1])?,
            conv_bias: if c.use_conv_bias { Some(conv.get("bias", &[conv_dim])?) } else { None },
            dt_bias: vb.get("dt_bias", &[heads])?,
            // mlx-lm's cast_predicate keeps A_log in its stored precision.
            a_log: vb.get_uncast("A_log", &[heads])?,
            d: vb.get("D", &[heads])?,
            norm_weight: vb.pp("norm").get("weight", &[inner])?,
            out_proj: Linear::load(&vb.pp("out_proj"), inner, c.hidden_size, c.mamba_proj_bias)?,
            heads,
            head_dim: c.mamba_head_dim,
            groups: c.n_groups,
            state_size: c.ssm_state_size,
            conv_kernel: c.conv_kernel,
            inner,
            conv_dim,
            eps: c.layer_norm_epsilon,
            dt_limit: c.time_step_limit().map_err(Error::InvalidArgument)?,
        })
    }

    /// `x` `[B, L, hidden]` → `[B, L, hidden]`, extending the recurrent state in `cache`.
    pub fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let st = cache
            .as_state()
            .ok_or_else(|| Error::InvalidArgument("a Mamba2 layer needs a recurrent-state cache".into()))?;
        let (b, l) = (x.dim(0), x.dim(1));
        let inner = self.inner as i32;
        let conv_dim = self.conv_dim as i32;
        let proj = self.in_proj.forward(x)?;
        let mut parts = proj.split_at(&[inner, inner + conv_dim], -1)?;
        let dt = parts.pop().expect("3 parts");
        let conv_in = parts.pop().expect("3 parts");
        let gate = parts.pop().expect("3 parts");

        // Causal depthwise conv over the carried window.
        let keep = self.conv_kernel as i32 - 1;
        let conv_state = match st.get(0) {
            Some(s) => s.clone(),
            None => Array::zeros(&[b, keep, conv_dim], conv_in.dtype())?,
        };
        let padded = Array::concatenate(&[&conv_state, &conv_in], 1)?;
        let t = padded.dim(1);
        // `padded[:, -n_keep:, :]` (with n_keep 0 Python keeps everything).
        st.set(0, if keep == 0 { padded.clone() } else { padded.slice_axis(1, t - keep, t)? });
        let mut conv = padded.conv1d(&self.conv_weight, 1, 0, 1, conv_dim)?;
        if let Some(bias) = &self.conv_bias {
            conv = conv.add(bias)?;
        }
        let conv = conv.silu()?;

        let gs = (self.groups * self.state_size) as i32;
        let mut xbc = conv.split_at(&[inner, inner + gs], -1)?;
        let c = xbc.pop().expect("3 parts");
        let bm = xbc.pop().expect("3 parts");
        let xs = xbc.pop().expect("3 parts");
        let (h, dh, g, n) = (self.heads as i32, self.head_dim as i32, self.groups as i32, self.state_size as i32);
        let xs = xs.reshape(&[b, l, h, dh])?;
        let bm = bm.reshape(&[b, l, g, n])?;
        let c = c.reshape(&[b, l, g, n])?;
        let (y, state) = self.ssd(&xs, &bm, &c, &dt, st.get(1).cloned())?;
        st.set(1, state);
        st.advance(l as usize);
        let y = y.reshape(&[b, l, inner])?;
        self.out_proj.forward(&self.gated_norm(&y, &gate)?)
    }

    /// `MambaRMSNormGated`: `weight · rms_norm_per_group(silu(gate) · y)`.
    fn gated_norm(&self, y: &Array, gate: &Array) -> Result<Array> {
        let y = fast::swiglu(gate, y)?;
        let mut shape = y.shape();
        let last = shape.pop().expect("rank 3");
        let group = last / self.groups as i32;
        let mut grouped = shape.clone();
        grouped.extend([self.groups as i32, group]);
        let normed = fast::rms_norm(&y.reshape(&grouped)?, None, self.eps)?;
        shape.push(last);
        self.norm_weight.multiply(&normed.reshape(&shape)?)
    }

    /// mlx-lm's `ssm_attn`: `x` `[B, L, H, Dh]`, `bm`/`c` `[B, L, G, N]`, `dt` `[B, L, H]` → (y
    /// `[B, L, H, Dh]` in x's dtype, the float32 state `[B, H, Dh, N]`).
    fn ssd(&self, x: &Array, bm: &Array, c: &Array, dt: &Array, mut state: Option<Array>) -> Result<(Array, Array)> {
        let (b, l) = (x.dim(0), x.dim(1));
        let (h, dh, g, n) = (self.heads as i32, self.head_dim as i32, self.groups as i32, self.state_size as i32);
        let rep = self.heads / self.groups;
        let f32 = Dtype::Float32;

        // compute_dt: clip(softplus(dt + dt_bias)) in float32.
        let dt = dt.astype(f32)?.add(&self.dt_bias)?;
        let dt = dt.logaddexp(&Array::scalar_f32(0.0, f32)?)?;
        let dt = dt.maximum(&Array::scalar_f32(self.dt_limit.0, f32)?)?;
        let dt = if self.dt_limit.1.is_finite() { dt.minimum(&Array::scalar_f32(self.dt_limit.1, f32)?)? } else { dt };
        let a = self.a_log.exp()?.astype(dt.dtype())?.negative()?;
        let dta = dt.multiply(&a.reshape(&[1, 1, -1])?)?; // [B, L, H]
        let dtx = dt.reshape(&[b, l, h, 1])?.multiply(x)?; // [B, L, H, Dh]

        let mut ys = vec![];
        let mut i = 0;
        while i < l {
            let e = (i + SSD_STEP).min(l);
            let s = e - i;
            let dtx_c = dtx.slice_axis(1, i, e)?;
            let dta_c = dta.slice_axis(1, i, e)?;
            let b_c = bm.slice_axis(1, i, e)?;
            let c_c = c.slice_axis(1, i, e)?;

            let bt = b_c.transpose(&[0, 2, 3, 1])?; // [B, G, N, s]
            let cb = repeat(&c_c.swapaxes(1, 2)?.matmul(&bt)?, rep, 1)?; // [B, H, s, s]
            let decay = self.segsum(&dta_c.swapaxes(1, 2)?)?.exp()?; // [B, H, s, s]
            let surrogate = tril(&cb.multiply(&decay)?, 0)?;
            let mut y = surrogate.matmul(&dtx_c.swapaxes(1, 2)?)?.swapaxes(1, 2)?; // [B, s, H, Dh]

            let last = decay.slice_axis(2, s - 1, s)?.transpose(&[0, 3, 1, 2])?; // [B, s, H, 1]
            let b_rep = repeat(&bt, rep, 1)?.swapaxes(2, 3)?; // [B, H, s, N]
            let dtxdecay = dtx_c.multiply(&last)?.swapaxes(1, 2)?.swapaxes(2, 3)?; // [B, H, Dh, s]
            let mut next = dtxdecay.matmul(&b_rep)?; // [B, H, Dh, N]

            if let Some(prev) = &state {
                let cum = dta_c.cumsum(-2, false, true)?.exp()?; // [B, s, H]
                let tail = cum.slice_axis(1, s - 1, s)?.reshape(&[b, h, 1, 1])?;
                next = next.add(&tail.multiply(prev)?)?;
                let c6 = c_c.reshape(&[b, s, g, 1, n, 1])?;
                let y_prev = prev.reshape(&[b, 1, g, rep as i32, dh, n])?.matmul(&c6)?.squeeze(-1)?.reshape(&[b, s, h, dh])?;
                y = y.add(&cum.expand_dims(-1)?.multiply(&y_prev)?)?;
            }
            ys.push(y.astype(x.dtype())?);
            state = Some(next);
            i = e;
        }
        let y = if ys.len() == 1 { ys.pop().expect("one") } else { Array::concatenate(&ys.iter().collect::<Vec<_>>(), 1)? };
        let d = self.d.astype(x.dtype())?.reshape(&[1, 1, h, 1])?;
        let y = y.add(&x.multiply(&d)?)?;
        Ok((y, state.expect("at least one chunk")))
    }

    /// `segsum` of `x` `[B, H, s]` → `[B, H, s, s]`: entry (i, j) the sum of `x[j+1..=i]` (0 on
    /// and above the diagonal).
    fn segsum(&self, x: &Array) -> Result<Array> {
        let s = x.dim(-1);
        let mut shape = x.shape();
        shape.push(s);
        let xs = x.expand_dims(-1)?.broadcast_to(&shape)?;
        tril(&xs, -1)?.cumsum(-2, false, true)
    }
}

impl Params for Mamba2Mixer {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.in_proj, self.conv_weight, self.conv_bias, self.dt_bias, self.a_log, self.d,
            self.norm_weight, self.out_proj);
    }
}

// ---- MLP and MoE --------------------------------------------------------------------------

/// `NemotronHMLP`: `down(relu²(up(x)))`.
pub struct Relu2Mlp {
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Relu2Mlp {
    fn load(vb: &Vb, hidden: usize, inter: usize, bias: bool) -> Result<Self> {
        Ok(Relu2Mlp {
            up_proj: Linear::load(&vb.pp("up_proj"), hidden, inter, bias)?,
            down_proj: Linear::load(&vb.pp("down_proj"), inter, hidden, bias)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&relu2(&self.up_proj.forward(x)?)?)
    }
}

impl Params for Relu2Mlp {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.up_proj, self.down_proj);
    }
}

/// Pairs from which mlx-lm sorts by expert (`indices.size >= 64`).
const SORT_MIN_PAIRS: usize = 64;

/// mlx-lm's `SwitchMLP` with relu²: `fc2(relu²(fc1(x)))` per selected expert.
pub struct SwitchRelu2Mlp {
    pub fc1: SwitchLinear,
    pub fc2: SwitchLinear,
}

impl SwitchRelu2Mlp {
    /// `x` `[B, L, D]`, `indices` `[B, L, k]` → `[B, L, k, D]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims(-2)?.expand_dims(-2)?; // [B, L, 1, 1, D]
        let (b, l, k) = (indices.dim(0), indices.dim(1), indices.dim(2));
        let sort = indices.size() >= SORT_MIN_PAIRS;
        let (x, idx, inverse) = if sort {
            let flat = indices.reshape(&[-1])?;
            let order = flat.argsort(0)?;
            let inverse = order.argsort(0)?;
            let token = order.floor_divide(&Array::scalar_i32(k, order.dtype())?)?;
            let x = x.reshape(&[b * l, 1, -1])?.take(&token, 0)?; // [N·k, 1, D]
            (x, flat.take(&order, 0)?, Some(inverse))
        } else {
            (x, indices.clone(), None)
        };
        let h = relu2(&self.fc1.forward(&x, &idx, sort)?)?;
        let y = self.fc2.forward(&h, &idx, sort)?;
        let y = match inverse {
            Some(inv) => y.take(&inv, 0)?.reshape(&[b, l, k, 1, -1])?,
            None => y,
        };
        y.squeeze(-2)
    }
}

/// `NemotronHMoE`.
pub struct Moe {
    /// The router's `[hidden, E]` (transposed `gate.weight`) and correction bias.
    pub gate_t: Array,
    pub correction: Array,
    pub experts: SwitchRelu2Mlp,
    pub shared: Option<Relu2Mlp>,
    pub latent: Option<(Linear, Linear)>,
    f: MoeFields,
    norm_topk_prob: bool,
}

impl Moe {
    fn load(vb: &Vb, c: &Config, f: MoeFields) -> Result<Self> {
        let h = c.hidden_size;
        stack_experts(vb, f.experts, &[("up_proj", "fc1"), ("down_proj", "fc2")], "switch_mlp")?;
        let expert_in = c.moe_latent_size.unwrap_or(h);
        let sw = vb.pp("switch_mlp");
        let gate = vb.pp("gate");
        Ok(Moe {
            gate_t: gate.get("weight", &[f.experts, h])?.swapaxes(-1, -2)?,
            correction: gate.get_uncast("e_score_correction_bias", &[f.experts])?,
            experts: SwitchRelu2Mlp {
                fc1: SwitchLinear::load(&sw.pp("fc1"), f.experts, expert_in, f.inter, false)?,
                fc2: SwitchLinear::load(&sw.pp("fc2"), f.experts, f.inter, expert_in, false)?,
            },
            shared: match c.n_shared_experts {
                Some(_) => Some(Relu2Mlp::load(
                    &vb.pp("shared_experts"),
                    h,
                    c.moe_shared_expert_intermediate_size.unwrap_or(c.intermediate_size),
                    c.mlp_bias,
                )?),
                None => None,
            },
            latent: match c.moe_latent_size {
                Some(lat) => Some((
                    Linear::load(&vb.pp("fc1_latent_proj"), h, lat, c.mlp_bias)?,
                    Linear::load(&vb.pp("fc2_latent_proj"), lat, h, c.mlp_bias)?,
                )),
                None => None,
            },
            f,
            norm_topk_prob: c.norm_topk_prob.unwrap_or(false),
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let f = &self.f;
        let (inds, scores) = group_expert_select(
            &x.matmul(&self.gate_t)?,
            &self.correction,
            f.k,
            f.n_group,
            f.topk_group,
            f.scale,
            self.norm_topk_prob,
        )?;
        let xe = match &self.latent {
            Some((down, _)) => down.forward(x)?,
            None => x.clone(),
        };
        let y = self.experts.forward(&xe, &inds)?;
        let y = combine(&y, &scores, Some(y.dtype()))?;
        let y = match &self.latent {
            Some((_, up)) => up.forward(&y)?,
            None => y,
        };
        match &self.shared {
            Some(s) => y.add(&s.forward(x)?),
            None => Ok(y),
        }
    }
}

impl Params for Moe {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.gate_t, self.correction, self.experts.fc1, self.experts.fc2, self.shared);
        if let Some((a, b)) = &self.latent {
            crate::params!(out; *a, *b);
        }
    }
}

// ---- blocks and model ---------------------------------------------------------------------

pub enum Mixer {
    Mamba(Mamba2Mixer),
    Attention(Attention),
    Mlp(Relu2Mlp),
    Moe(Moe),
}

/// `NemotronHBlock`: `x + mixer(norm(x))`.
pub struct Block {
    pub norm: RmsNorm,
    pub mixer: Mixer,
}

impl Block {
    fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let h = self.norm.forward(x)?;
        let h = match &self.mixer {
            Mixer::Mamba(m) => m.forward(&h, cache)?,
            Mixer::Attention(a) => a.forward(&h, cache)?,
            Mixer::Mlp(m) => {
                count_tokens(cache, &h);
                m.forward(&h)?
            }
            Mixer::Moe(m) => {
                count_tokens(cache, &h);
                m.forward(&h)?
            }
        };
        x.add(&h)
    }
}

/// A stateless layer's cache only counts the tokens seen.
fn count_tokens(cache: &mut dyn Cache, h: &Array) {
    if let Some(s) = cache.as_state() {
        s.advance(h.dim(1) as usize);
    }
}

impl Params for Block {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        self.norm.params(out);
        match &self.mixer {
            Mixer::Mamba(m) => m.params(out),
            Mixer::Attention(a) => a.params(out),
            Mixer::Mlp(m) => m.params(out),
            Mixer::Moe(m) => m.params(out),
        }
    }
}

/// `backbone.embeddings` → `backbone.layers.*` → `backbone.norm_f` → `lm_head`.
pub struct NemotronH {
    pub embeddings: Embedding,
    pub layers: Vec<Block>,
    pub norm_f: RmsNorm,
    pub lm_head: LmHead,
    pub vocab_size: usize,
}

impl CausalLm for NemotronH {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embeddings.forward(tokens)
    }

    fn forward_embeddings(&self, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        let h = run_layers(h, &self.layers, caches, |l, _, x, c| l.forward(x, c))?;
        self.lm_head.forward(&self.norm_f.forward(&h)?, &self.embeddings)
    }

    fn make_caches(&self) -> LayerCaches {
        LayerCaches(
            self.layers
                .iter()
                .map(|l| match l.mixer {
                    Mixer::Mamba(_) => Box::new(StateCache::new(2)) as Box<dyn Cache>,
                    Mixer::Attention(_) => Box::new(KvCache::new()) as Box<dyn Cache>,
                    Mixer::Mlp(_) | Mixer::Moe(_) => Box::new(StateCache::new(0)) as Box<dyn Cache>,
                })
                .collect(),
        )
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn dtype(&self) -> Dtype {
        self.norm_f.weight.dtype()
    }
}

impl Params for NemotronH {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        crate::params!(out; self.embeddings, self.layers, self.norm_f, self.lm_head);
    }
}

impl Loadable for NemotronH {
    type Config = Config;

    fn load(c: Config, _: &ModelConfig, vb: &Vb) -> Result<Self> {
        let kinds = c.kinds().map_err(Error::InvalidArgument)?;
        let moe = if kinds.contains(&BlockKind::Moe) { Some(c.moe().map_err(Error::InvalidArgument)?) } else { None };
        // mlx-lm's sanitize drops the multi-token-prediction head.
        vb.pp("mtp").discard_all();
        let bb = vb.pp("backbone");
        let head_dim = c.head_dim();
        let spec = AttentionSpec {
            hidden: c.hidden_size,
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim,
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias,
            qk_norm: None,
            scale: (head_dim as f64).powf(-0.5) as f32,
            sinks: false,
        };
        let layers = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let lv = bb.pp("layers").pp(i);
                let mv = lv.pp("mixer");
                let mixer = match kind {
                    BlockKind::Mamba => Mixer::Mamba(Mamba2Mixer::load(&mv, &c)?),
                    BlockKind::Attention => Mixer::Attention(Attention::load(&mv, &spec, None)?),
                    BlockKind::Mlp => Mixer::Mlp(Relu2Mlp::load(&mv, c.hidden_size, c.intermediate_size, c.mlp_bias)?),
                    BlockKind::Moe => Mixer::Moe(Moe::load(&mv, &c, moe.expect("checked"))?),
                };
                Ok(Block { norm: RmsNorm::load(&lv.pp("norm"), c.hidden_size, c.layer_norm_epsilon)?, mixer })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(NemotronH {
            embeddings: Embedding::load(&bb.pp("embeddings"), c.vocab_size, c.hidden_size)?,
            layers,
            norm_f: RmsNorm::load(&bb.pp("norm_f"), c.hidden_size, c.layer_norm_epsilon)?,
            lm_head: LmHead::load(vb, false, c.hidden_size, c.vocab_size)?,
            vocab_size: c.vocab_size,
        })
    }
}

pub const ARCH: Architecture = Architecture::new::<NemotronH>("nemotron_h", &[]);

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        serde_json::json!({
            "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "attention_bias": false,
            "mamba_num_heads": 8, "mamba_head_dim": 16, "mamba_proj_bias": false,
            "ssm_state_size": 16, "conv_kernel": 4, "n_groups": 2, "mlp_bias": false,
            "layer_norm_epsilon": 1e-5, "use_conv_bias": true, "hybrid_override_pattern": "M-M*"
        })
    }

    fn check(v: Value) -> std::result::Result<Vec<BlockKind>, String> {
        let c: Config = serde_json::from_value(v).map_err(|e| e.to_string())?;
        c.validate()?;
        c.kinds()
    }

    #[test]
    fn pattern_and_validation() {
        use BlockKind::*;
        assert_eq!(check(base()).unwrap(), vec![Mamba, Mlp, Mamba, Attention]);
        let mut v = base();
        v["hybrid_override_pattern"] = serde_json::json!(["M", "E"]);
        let e = check(v.clone()).unwrap_err();
        assert!(e.contains("n_routed_experts"), "{e}");
        v["hybrid_override_pattern"] = Value::Null;
        v["layers_block_type"] = serde_json::json!(["mamba", "attention", "mlp"]);
        assert_eq!(check(v).unwrap(), vec![Mamba, Attention, Mlp]);
        let mut v = base();
        v["n_groups"] = serde_json::json!(0);
        assert!(check(v).unwrap_err().contains("n_groups"));
        let mut v = base();
        v.as_object_mut().unwrap().remove("ssm_state_size");
        assert!(check(v).unwrap_err().contains("ssm_state_size"));
        let mut v = base();
        v["hybrid_override_pattern"] = serde_json::json!("M-X");
        assert!(check(v).unwrap_err().contains("hybrid_override_pattern[2]"));
        let mut v = base();
        v.as_object_mut().unwrap().remove("hybrid_override_pattern");
        assert!(check(v).unwrap_err().contains("hybrid_override_pattern"));
    }
}

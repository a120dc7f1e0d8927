//! A [`VisionLm`] whose text model takes 3-D rope positions (Qwen3.5, issue 15): the positions
//! of a prompt chunk's tokens from its ids (an image's ids say which image and which of its
//! tokens, its decoded size gives its merged grid: see [`crate::models::mrope`]), and the
//! [`PositionCache`] after the text model's caches that carries each image's shift to the text
//! after it and to decode steps. A video's rows are placed by the grid kept with them
//! ([`MediaGrid`]: per temporal group, or one block).
use super::{is_media_token, VisionLm, MEDIA_TOKEN_BASE};
use crate::error::{Error, Result};
use crate::mlx::Array;
use crate::models::mrope::{position_cache, MediaGrid, PositionCache, RopePositions};
use crate::nn::LayerCaches;

impl VisionLm {
    /// Marks this model's text model as taking multimodal rope positions (its caches get a
    /// [`PositionCache`]; its encoder must give each image's grid).
    pub fn with_mrope(mut self) -> Self {
        self.mrope = true;
        self
    }

    /// A prompt chunk: text rows from the embedding, image rows as kept (no scaling: Qwen merges
    /// the tower's rows into the embeddings as they are), at their 3-D positions. With deepstack
    /// (Qwen3-VL) the kept rows carry their features after them: those go to the text model as
    /// arrays of the chunk's length, zero at the text positions (mlx-vlm adds them at the image
    /// and video positions only; adding zero leaves a row as it is).
    pub(super) fn forward_prompt_mrope(&self, ids: &[u32], caches: &mut LayerCaches) -> Result<Array> {
        let k = if ids.iter().any(|&t| is_media_token(t)) { self.encoder.deepstack_layers() } else { 0 };
        let mut parts = vec![];
        let mut deep: Vec<Vec<Array>> = (0..k).map(|_| vec![]).collect();
        let mut i = 0;
        while i < ids.len() {
            let media = is_media_token(ids[i]);
            let j = i + ids[i..].iter().take_while(|&&t| is_media_token(t) == media).count();
            if media {
                let rows = self.media_rows(&ids[i..j])?.astype(self.text.dtype())?.expand_dims(0)?;
                if k == 0 {
                    parts.push(rows);
                } else {
                    let w = rows.shape()[2];
                    let hidden = w / (k as i32 + 1);
                    if hidden * (k as i32 + 1) != w {
                        return Err(Error::Mlx(format!("image rows {w} wide do not hold {k} deepstack features")));
                    }
                    parts.push(rows.slice_axis(2, 0, hidden)?);
                    for (d, out) in deep.iter_mut().enumerate() {
                        let at = (d as i32 + 1) * hidden;
                        out.push(rows.slice_axis(2, at, at + hidden)?);
                    }
                }
            } else {
                let rows = self.text.embed(&Array::from_slice(&ids[i..j], &[1, (j - i) as i32])?)?;
                for out in deep.iter_mut() {
                    out.push(Array::zeros(&rows.shape(), rows.dtype())?);
                }
                parts.push(rows);
            }
            i = j;
        }
        let cat = |parts: &[Array]| -> Result<Array> {
            let refs: Vec<&Array> = parts.iter().collect();
            Array::concatenate(&refs, 1)
        };
        let h = cat(&parts)?;
        let deep = deep.iter().map(|p| cat(p)).collect::<Result<Vec<_>>>()?;
        self.forward_mrope_deepstack(Some(ids), h, &deep, caches)
    }

    /// Rows `h` `[1, L, hidden]` through the text model at their positions: `ids`' (a prompt
    /// chunk's) when they hold an image, else `offset + shift` on every axis.
    pub(super) fn forward_mrope(&self, ids: Option<&[u32]>, h: Array, caches: &mut LayerCaches) -> Result<Array> {
        self.forward_mrope_deepstack(ids, h, &[], caches)
    }

    /// [`Self::forward_mrope`], with deepstack features (none: the text model's plain call).
    fn forward_mrope_deepstack(&self, ids: Option<&[u32]>, h: Array, deep: &[Array], caches: &mut LayerCaches) -> Result<Array> {
        let mut boxed = caches.0.pop().ok_or_else(|| Error::InvalidArgument("no caches".into()))?;
        let out = (|| -> Result<Array> {
            let pc = position_cache(boxed.as_mut())?;
            let start = crate::nn::Cache::offset(pc);
            let l = h.shape()[1] as usize;
            let positions = match ids {
                Some(ids) if ids.iter().any(|&t| is_media_token(t)) => RopePositions::Grid(self.grid_positions(ids, start, pc)?),
                _ => {
                    let p = start as i64 + pc.shift_at(start);
                    RopePositions::Start(usize::try_from(p).map_err(|_| Error::Mlx(format!("negative rope position {p}")))?)
                }
            };
            let out = if deep.is_empty() {
                self.text.forward_embeddings_at(h, &positions, caches)?
            } else {
                self.text.forward_embeddings_deepstack(h, &positions, deep, caches)?
            };
            pc.advance(l);
            Ok(out)
        })();
        caches.0.push(boxed);
        out
    }

    /// The (t, h, w) positions of the chunk `ids` starting at token `start`, recording in `pc`
    /// each image that ends in it.
    fn grid_positions(&self, ids: &[u32], start: usize, pc: &mut PositionCache) -> Result<[Vec<i32>; 3]> {
        let slots = self.slots.lock().map_err(|_| Error::Mlx("image slots poisoned by a panic".into()))?;
        let mut shift = pc.shift_at(start);
        let mut out = [Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len())];
        for (j, &id) in ids.iter().enumerate() {
            let abs = (start + j) as i64;
            if !is_media_token(id) {
                let p = (abs + shift) as i32;
                for axis in &mut out {
                    axis.push(p);
                }
                continue;
            }
            let at = id - MEDIA_TOKEN_BASE;
            let kept = slots.kept.iter().find(|k| k.first <= at && at < k.first + k.len).ok_or_else(|| {
                Error::InvalidArgument("the prompt refers to an image this session no longer keeps".into())
            })?;
            let k = (at - kept.first) as usize;
            let grid = match kept.grid {
                Some(g) => Some(g),
                None => self.encoder.mrope_grid(kept.size).map(|(h, w)| MediaGrid { t: 1, h, w, stacked: false }),
            };
            let grid = grid
                .filter(|g| g.rows() == kept.len as usize)
                .ok_or_else(|| Error::Mlx(format!("an image of {} rows has no rope grid", kept.len)))?;
            let place = grid.place(k);
            let s = abs - place.in_block as i64 + shift;
            for (axis, d) in out.iter_mut().zip(place.offsets) {
                axis.push((s + d) as i32);
            }
            if let Some(d) = place.ends_block {
                shift += d;
                pc.push_image(abs as usize + 1, d);
            }
        }
        Ok(out)
    }
}

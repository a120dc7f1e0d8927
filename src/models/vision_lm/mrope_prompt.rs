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
    /// the tower's rows into the embeddings as they are), at their 3-D positions.
    pub(super) fn forward_prompt_mrope(&self, ids: &[u32], caches: &mut LayerCaches) -> Result<Array> {
        let mut parts = vec![];
        let mut i = 0;
        while i < ids.len() {
            let media = is_media_token(ids[i]);
            let j = i + ids[i..].iter().take_while(|&&t| is_media_token(t) == media).count();
            parts.push(if media {
                self.media_rows(&ids[i..j])?.astype(self.text.dtype())?.expand_dims(0)?
            } else {
                self.text.embed(&Array::from_slice(&ids[i..j], &[1, (j - i) as i32])?)?
            });
            i = j;
        }
        let refs: Vec<&Array> = parts.iter().collect();
        let h = Array::concatenate(&refs, 1)?;
        self.forward_mrope(Some(ids), h, caches)
    }

    /// Rows `h` `[1, L, hidden]` through the text model at their positions: `ids`' (a prompt
    /// chunk's) when they hold an image, else `offset + shift` on every axis.
    pub(super) fn forward_mrope(&self, ids: Option<&[u32]>, h: Array, caches: &mut LayerCaches) -> Result<Array> {
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
            let out = self.text.forward_embeddings_at(h, &positions, caches)?;
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

//! The parameters of a model as a list of arrays (evaluated once at load, counted for
//! `weights_bytes`): every layer lists its own, a model lists its layers'.
use crate::mlx::Array;

pub trait Params {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>);
}

impl Params for Array {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        out.push(self);
    }
}

impl<T: Params> Params for Option<T> {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        if let Some(x) = self {
            x.params(out);
        }
    }
}

impl<T: Params> Params for Vec<T> {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        for x in self {
            x.params(out);
        }
    }
}

impl<T: Params + ?Sized> Params for Box<T> {
    fn params<'a>(&'a self, out: &mut Vec<&'a Array>) {
        (**self).params(out);
    }
}

/// `params!(out; a, b, c)`: each field's parameters, in order.
#[macro_export]
macro_rules! params {
    ($out:expr; $($field:expr),* $(,)?) => {{
        $( $crate::nn::module::Params::params(&$field, $out); )*
    }};
}

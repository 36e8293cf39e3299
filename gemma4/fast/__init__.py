"""The speed layer: stacked products, the attention norms as one table, oneDNN-packed CPU weights (a fixed rule
of device, dtype and shape chooses them). The loaders apply it after building a model (`load_target(...,
fast=True)`, the default, imports it there); the model never imports it, and `fast=False` gives the textbook
modules and the same tokens. See README.md here."""

from gemma4.fast.apply import kernels_of, make_fast, products
from gemma4.fast.kernels import VERIFY_ROWS, Choice, Product

__all__ = ["VERIFY_ROWS", "Choice", "Product", "kernels_of", "make_fast", "products"]

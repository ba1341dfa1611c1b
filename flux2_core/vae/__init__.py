"""The FLUX.2 autoencoder: latents <-> pixels. Encoder and decoder blocks shared with FLUX.1's VAE
(``blocks``), the 2x2 patchify + BatchNorm latent format (``latent_format``), the model and its loader
(``autoencoder``), and tiled decode / encode with its memory estimate (``tiling``)."""

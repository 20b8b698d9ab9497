"""ftis-edge: collaborative GRPO post-training with F-TIS on consumer hardware."""

__version__ = "0.1.0"

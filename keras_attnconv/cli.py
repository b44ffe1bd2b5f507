"""The `attnconv` command line."""

import argparse
import sys


def _list(args):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from keras_attnconv.models.summary import markdown_table, model_rows

    print(markdown_table(model_rows(args.models or None)))
    print(
        "\nFLOPs per 32x32 image, 2 per multiply-add. 'weights' counts products with weight kernels "
        "(convolutions, Dense, attention projections), the convention of the paper's Table 1; "
        "'with attention' adds the attention scores and the probability-weighted sums."
    )
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="attnconv",
        description="keras_attnconv: self-attention as convolution (Cordonnier et al., ICLR 2020).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    listing = commands.add_parser("list", help="the model zoo: parameters and FLOPs beside the paper's")
    listing.add_argument("models", nargs="*", help="only these models (default: all)")
    listing.set_defaults(handler=_list)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())

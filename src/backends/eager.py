"""The baseline: the model as written, no compilation."""
import cnncompare


class Eager:
    name = "eager"
    description = "nn.Module as written, no compilation (the baseline every speedup is against)"

    def compile(self, model, example, device):
        return model


@cnncompare.hookimpl
def cnncompare_register_backends(register):
    register(Eager())

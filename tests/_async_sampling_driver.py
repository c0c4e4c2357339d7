"""A long ``AsyncSamplingDataModule`` fit that prints its sampler pids at its second item (run as a script).

``test_async_sampling`` kills this process with ``kill -9`` and checks that its samplers die too.
"""

from lightning.pytorch import Callback, Trainer

from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.data import AsyncSamplingDataModule


class Announce(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 1:
            print(" ".join(str(pid) for pid in trainer.datamodule.pool.pids), flush=True)


if __name__ == "__main__":
    data = AsyncSamplingDataModule(
        "CartPole-v1", num_envs=1, rollout_fragment_length=16, rollouts_per_epoch=10**6, num_env_runners=2, seed=0
    )
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[Announce()],
    )  # fmt: skip
    trainer.fit(PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=16), datamodule=data)

"""The book's chapter-2 dataset (GPTDatasetV1), in our own words: the windows
of a token sequence that create_dataloader_v1 hands to a torch DataLoader.
Used by oracle_loader.py and oracle_walkthrough_ch5.py.
"""
import torch
from torch.utils.data import Dataset


class Windows(Dataset):
    """Windows of max_length ids every stride; the targets one token later."""

    def __init__(self, ids, max_length, stride):
        self.inputs, self.targets = [], []
        for i in range(0, len(ids) - max_length, stride):
            self.inputs.append(torch.tensor(ids[i:i + max_length]))
            self.targets.append(torch.tensor(ids[i + 1:i + max_length + 1]))

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, k):
        return self.inputs[k], self.targets[k]

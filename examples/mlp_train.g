# A 2-layer MLP classifier and its loss: softmax cross-entropy against one-hot labels.
# `eqfuse grad examples/mlp_train.g --wrt w1,b1,w2,b2 --dim B=64` prints its backward graph;
# examples/train_mlp.py trains it.
graph mlp_train(x: f32[B, 2], onehot: f32[B, 3], w1: f32[2, 64], b1: f32[64], w2: f32[64, 3],
                b2: f32[3]) -> (f32, f32[B, 3]) {
    h = relu(x @ w1 + b1)
    logits = h @ w2 + b2
    loss = -mean(sum(onehot * log(softmax(logits)), axis=-1))
    return loss, logits
}

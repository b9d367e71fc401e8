"""Chainer v7.8.1's public names, module by module: what a port may meet.

For each module, the names its source binds at top level that do not start
with ``_`` (functions, classes, values, names imported from Chainer or CuPy,
its own submodules imported there; not the Chainer modules it merely uses),
and for the ``chainer`` package also its modules (``chainer.link_hooks``).
Made by ``python tests/_chainer_names.py CHAINER_SOURCE`` over a checkout
of chainer/chainer at tag v7.8.1 (the folder holding ``chainer/``), which
prints the dict below; tests/test_porting.py checks docs/porting.md
against it.
"""
import ast
import os
import sys

NAMES = {
    'chainer': '''
        AbstractSerializer Chain ChainList DebugMode Deserializer
        DeviceResident DictSummary Distribution Fallback Function
        FunctionAdapter FunctionHook FunctionNode GradientMethod
        Initializer Link LinkHook Optimizer Parameter Reporter
        Sequential Serializer Summary UpdateRule Variable array
        as_array as_variable backend backends backward basic_math
        computational_graph config configuration cross_entropy cuda
        dataset datasets device_resident
        disable_experimental_feature_warning distribution
        distributions exporters force_backprop_mode function
        function_hook function_hooks function_node functions
        get_array_types get_compute_mode get_cpu_array_types
        get_current_reporter get_device get_dtype get_function_hooks
        global_config grad gradient_check graph_optimizations
        initializer initializers is_arrays_compatible is_debug
        iterators kl_divergence link link_hook link_hooks links
        memory_layouts mixed16 no_backprop_mode optimizer
        optimizer_hooks optimizers print_runtime_info register_kl
        report report_scope reporter sequential serializer serializers
        set_debug should_use_cudnn should_use_cudnn_tensor_core
        static_code static_graph testing training types using_config
        using_device utils variable warnings''',
    'chainer.functions': '''
        absolute absolute_error accuracy add arccos arcsin arctan
        arctan2 arctanh argmax argmax_crf1d argmin as_strided average
        average_pooling_1d average_pooling_2d average_pooling_3d
        average_pooling_nd batch_det batch_inv batch_l2_norm_squared
        batch_matmul batch_normalization batch_renormalization
        bernoulli_nll bias bilinear binary_accuracy black_out
        broadcast broadcast_to cast ceil cholesky
        classification_summary clip clipped_relu concat
        connectionist_temporal_classification contrastive
        convolution_1d convolution_2d convolution_3d convolution_nd
        copy cos cosh crelu crf1d cross_covariance cumprod cumsum
        deconvolution_1d deconvolution_2d deconvolution_3d
        deconvolution_nd decorrelated_batch_normalization decov
        deformable_convolution_2d_sampler depth2space
        depthwise_convolution_2d det diagonal digamma
        dilated_convolution_2d
        discriminative_margin_based_clustering_loss dropout dstack
        einsum elu embed_id erf erfc erfcinv erfcx erfinv exp
        expand_dims expm1 f1_score fft fix fixed_batch_normalization
        fixed_batch_renormalization
        fixed_decorrelated_batch_normalization flatten flip fliplr
        flipud floor fmod forget gaussian gaussian_kl_divergence
        gaussian_nll get_item group_normalization gumbel_softmax
        hard_sigmoid hinge hstack huber_loss identity ifft im2col inv
        layer_normalization leaky_relu lgamma linear
        linear_interpolate local_convolution_2d
        local_response_normalization log log10 log1p log2 log_ndtr
        log_softmax logsumexp lstm matmul max max_pooling_1d
        max_pooling_2d max_pooling_3d max_pooling_nd maximum maxout
        mean mean_absolute_error mean_squared_error min minimum
        moveaxis n_step_bigru n_step_bilstm n_step_birnn n_step_gru
        n_step_lstm n_step_rnn ndtr ndtri negative_sampling normalize
        pad pad_sequence permutate polygamma precision prelu prod
        r2_score recall relu relu6 repeat reshape resize_images
        roi_average_align_2d roi_average_pooling_2d roi_max_align_2d
        roi_max_pooling_2d roi_pooling_2d rollaxis rrelu rsqrt scale
        scatter_add select_item selu separate shift sigmoid
        sigmoid_cross_entropy sign simplified_dropconnect sin sinh
        slstm softmax softmax_cross_entropy softplus space2depth
        sparse_matmul spatial_pyramid_pooling_2d
        spatial_transformer_grid spatial_transformer_sampler
        split_axis sqrt square squared_difference squared_error
        squeeze stack sum sum_to swapaxes swish tan tanh tensordot
        tile transpose transpose_sequence tree_lstm triplet
        unpooling_1d unpooling_2d unpooling_3d unpooling_nd
        upsampling_2d vstack where zeta zoneout''',
    'chainer.links': '''
        BatchNormalization BatchRenormalization Bias Bilinear
        BinaryHierarchicalSoftmax BlackOut CRF1d ChildSumTreeLSTM
        Classifier Convolution1D Convolution2D Convolution3D
        ConvolutionND Deconvolution1D Deconvolution2D Deconvolution3D
        DeconvolutionND DecorrelatedBatchNormalization
        DeformableConvolution2D DepthwiseConvolution2D
        DilatedConvolution2D EmbedID GRU GoogLeNet GroupNormalization
        Highway Inception InceptionBN LSTM LayerNormalization Linear
        LocalConvolution2D MLPConvolution2D Maxout NStepBiGRU
        NStepBiLSTM NStepBiRNNReLU NStepBiRNNTanh NStepGRU NStepLSTM
        NStepRNNReLU NStepRNNTanh NaryTreeLSTM NegativeSampling PReLU
        Parameter ResNet101Layers ResNet152Layers ResNet50Layers Scale
        SimplifiedDropconnect StatefulGRU StatefulMGU
        StatefulPeepholeLSTM StatefulZoneoutLSTM StatelessGRU
        StatelessLSTM StatelessMGU Swish TheanoFunction VGG16Layers
        VGG19Layers''',
    'chainer.optimizers': '''
        AMSBound AMSGrad AdaBound AdaDelta AdaGrad Adam AdamW
        CorrectedMomentumSGD MSVAG MomentumSGD NesterovAG RMSprop
        RMSpropGraves SGD SMORMS3''',
    'chainer.optimizer': '''
        GradientClipping GradientHardClipping GradientMethod
        GradientNoise Hyperparameter HyperparameterProxy Lasso
        Optimizer UpdateRule WeightDecay make_deprecation_message''',
    'chainer.optimizer_hooks': '''
        GradientClipping GradientHardClipping GradientLARS
        GradientNoise Lasso WeightDecay''',
    'chainer.initializers': '''
        Constant DownsamplingConvFilter GlorotNormal GlorotUniform
        HeNormal HeUniform Identity LeCunNormal LeCunUniform NaN
        Normal One Orthogonal Uniform UpsamplingDeconvFilter Zero
        generate_array''',
    'chainer.iterators': '''
        DaliIterator MultiprocessIterator MultithreadIterator
        OrderSampler SerialIterator ShuffleOrderSampler''',
    'chainer.dataset': '''
        ConcatWithAsyncTransfer Converter DatasetMixin Iterator
        TabularDataset cache_or_load_file cached_download
        concat_examples converter get_dataset_directory
        get_dataset_root set_dataset_root to_device''',
    'chainer.datasets': '''
        ConcatenatedDataset DictDataset ImageDataset
        LabeledImageDataset LabeledZippedImageDataset
        MultiZippedImageDataset PickleDataset PickleDatasetWriter
        SubDataset TextDataset TransformDataset TupleDataset
        ZippedImageDataset get_cifar10 get_cifar100
        get_cross_validation_datasets
        get_cross_validation_datasets_random get_fashion_mnist
        get_fashion_mnist_labels get_kuzushiji_mnist
        get_kuzushiji_mnist_labels get_mnist get_ptb_words
        get_ptb_words_vocabulary get_svhn open_pickle_dataset
        open_pickle_dataset_writer split_dataset split_dataset_n
        split_dataset_n_random split_dataset_random''',
    'chainer.serializers': '''
        DictionarySerializer HDF5Deserializer HDF5Serializer
        NpzDeserializer load_hdf5 load_npz save_hdf5 save_npz''',
    'chainer.training': '''
        Extension IntervalTrigger PRIORITY_EDITOR PRIORITY_READER
        PRIORITY_WRITER ParallelUpdater StandardUpdater Trainer
        Updater extensions get_trigger make_extension triggers
        updaters util''',
    'chainer.training.extensions': '''
        DumpGraph Evaluator ExponentialShift FailOnNonNumber
        InverseShift LinearShift LogReport MicroAverage MultistepShift
        ParameterStatistics PlotReport PolynomialShift PrintReport
        ProgressBar StepShift VariableStatisticsPlot WarmupShift
        dump_graph observe_lr observe_value snapshot snapshot_object
        unchain_variables''',
    'chainer.training.triggers': '''
        BestValueTrigger EarlyStoppingTrigger IntervalTrigger
        ManualScheduleTrigger MaxValueTrigger MinValueTrigger
        OnceTrigger TimeTrigger''',
    'chainer.training.updaters': '''
        MultiprocessParallelUpdater ParallelUpdater StandardUpdater''',
    'chainer.reporter': '''
        DictSummary Reporter Summary get_current_reporter report
        report_scope''',
    'chainer.gradient_check': '''
        NondifferentiableError assert_allclose check_backward
        check_double_backward numerical_grad''',
    'chainer.backends': '''
        cuda intel64''',
    'chainer.backends.cuda': '''
        Device DummyDevice DummyDeviceType Event GpuDevice Stream
        available check_cuda_available clear_memo config copy cublas
        cudnn cudnn_enabled cupy cupyx elementwise fuse
        get_array_module get_cudnn_dropout_states
        get_cudnn_dropout_states_core get_device get_device_from_array
        get_device_from_id get_max_workspace_size libcudnn memoize
        memory_pool ndarray pinned_memory_pool raw reduce
        set_max_workspace_size should_use_cudnn
        should_use_cudnn_tensor_core to_cpu to_gpu''',}
NAMES = {module: names.split() for module, names in NAMES.items()}


def _statements(body):
    """Top-level statements, also inside top-level if/try blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            yield from _statements(node.body + node.orelse + getattr(
                node, 'finalbody', []))
            for handler in getattr(node, 'handlers', []):
                yield from _statements(handler.body)


def _is_module(root, dotted):
    path = os.path.join(root, *dotted.split('.'))
    return os.path.isdir(path) or os.path.exists(path + '.py')


def _bound(root, module, node, alias):
    """The name an import binds, if the module re-exports it: from
    Chainer or CuPy, and not a Chainer module other than its own child."""
    if isinstance(node, ast.Import):
        source = alias.name
        own = source.startswith(module + '.')
        bound = alias.asname or source.split('.')[
            module.count('.') + 1 if own else 0]
    else:
        source, bound = node.module + '.' + alias.name, alias.asname or \
            alias.name
    if source.split('.')[0] not in ('chainer', 'cupy', 'cupyx') or (
            _is_module(root, source) and not source.startswith(module + '.')):
        return []
    return [bound]


def public_names(root, module):
    """The names of ``module`` by the rule above; ``root`` holds
    ``chainer/``."""
    path = os.path.join(root, *module.split('.'))
    package = os.path.isdir(path)
    names = set()
    if module == 'chainer':
        names.update(n[:-3] if n.endswith('.py') else n
                     for n in os.listdir(path) if n != '__init__.py' and (
                         n.endswith('.py') or os.path.exists(
                             os.path.join(path, n, '__init__.py'))))
    with open(os.path.join(path, '__init__.py') if package else
              path + '.py') as f:
        tree = ast.parse(f.read())
    for node in _statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(n.id for t in node.targets for n in ast.walk(t)
                         if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.update(_bound(root, module, node, alias))
    return sorted(n for n in names
                  if n[0] != '_' and n != module.split('.')[-1])


if __name__ == '__main__':
    for module in NAMES:
        print(module, ' '.join(public_names(sys.argv[1], module)))
